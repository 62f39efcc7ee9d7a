//! The kubelet the kubelet unit actually runs (issue 27 §2): its unit file and drop-ins
//! read in systemd's order (systemd.unit(5) "Unit File Load Path": the first directory
//! that has the unit file wins; drop-ins `<unit>.d/*.conf` from every directory, one per
//! file name (the higher-priority directory's), sorted by file name) and the effective
//! `ExecStart=` taken ([`inplace_formats::kubelet::unit::effective_exec_start`]).

use crate::sections::kit::observe;
use inplace_formats::kubelet::unit::{ExecStart, effective_exec_start};
use inplace_node::sysroot::Sysroot;

/// The system unit load path, highest priority first (systemd.unit(5)).
pub(crate) const UNIT_DIRS: &[&str] = &[
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/etc/systemd/system",
    "/run/systemd/system",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
];

/// The effective `ExecStart=` of `unit` on the node; None when the unit file is not
/// found or sets none (nothing to compare: not a refusal).
pub(crate) fn kubelet_exec_start(root: &Sysroot, unit: &str) -> Option<ExecStart> {
    let files = unit_files(root, unit)?;
    effective_exec_start(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

/// The unit file of `unit` and its `<unit>.d/*.conf` drop-ins in systemd's order (path,
/// text); None when the unit file is not found.
pub(crate) fn unit_files(root: &Sysroot, unit: &str) -> Option<Vec<(String, String)>> {
    let main = UNIT_DIRS
        .iter()
        .map(|d| format!("{d}/{unit}"))
        .find_map(|p| {
            observe::read_string(root, &p)
                .ok()
                .flatten()
                .map(|t| (p, t))
        })?;
    let mut dropins: std::collections::BTreeMap<String, String> = Default::default();
    for d in UNIT_DIRS {
        let dir = format!("{d}/{unit}.d");
        for name in observe::list_dir(root, &dir)
            .ok()
            .flatten()
            .unwrap_or_default()
        {
            if name.ends_with(".conf") && !dropins.contains_key(&name) {
                dropins.insert(name.clone(), format!("{dir}/{name}"));
            }
        }
    }
    let mut files = vec![main];
    for path in dropins.into_values() {
        if let Ok(Some(t)) = observe::read_string(root, &path) {
            files.push((path, t));
        }
    }
    Some(files)
}

/// Why the upgrade would not change the kubelet that runs: the unit's program is not
/// `installed` (the path the source installs), both followed through symlinks.
pub(crate) fn runs_another_kubelet(
    root: &Sysroot,
    exec: &ExecStart,
    installed: &str,
) -> Option<String> {
    let real = |p: &str| root.resolve(p).unwrap_or_else(|_| p.to_string());
    (real(&exec.program) != real(installed)).then(|| {
        format!(
            "the kubelet unit runs {} (the effective ExecStart= is in {}), not {installed}, which the upgrade installs: the running kubelet would not change; point [kubernetes] bin_dir at {}'s directory or the unit at {installed}",
            exec.program, exec.file, exec.program
        )
    })
}
