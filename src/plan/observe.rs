//! Observed state: everything the planner needs from the node, read once through the
//! sysroot, so that [`super::plan`] is a pure function.

use std::collections::BTreeMap;

use crate::bootloader::{self, KernelArgsBackend, NoBackend};
use crate::config::Config;
use crate::node::accounts::Accounts;
use crate::node::sysroot::{Entry, Kind, Parents, Sysroot, SysrootError};
use crate::spec::NodeSpec;
use crate::state::{AppliedRecord, Original, StateDir, StateError};

/// A file as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileObs {
    /// Absent; parents present or missing (to be created).
    Absent,
    /// A regular file.
    File {
        /// Content.
        content: Vec<u8>,
        /// Metadata.
        entry: Entry,
    },
    /// Can not be written: a parent is a file or symlink, or the path is a dir/symlink.
    Conflict(String),
}

/// Kubelet files as observed.
#[derive(Debug, Clone, Default)]
pub struct KubeletObs {
    /// Config file text and metadata (None = absent).
    pub config: Option<(String, Entry)>,
    /// Flags env file text and metadata (None = absent).
    pub flags: Option<(String, Entry)>,
    /// `KUBELET_EXTRA_ARGS` per override file that exists: path → flags.
    pub extra_args: Vec<(String, Vec<crate::kubelet::flags::Flag>)>,
    /// Read problems to report as not covered (parse errors).
    pub problems: Vec<String>,
}

/// Sysctls as observed.
#[derive(Debug, Clone, Default)]
pub struct SysctlObs {
    /// Live values (None = the key does not exist under /proc/sys).
    pub live: BTreeMap<String, Option<String>>,
    /// The drop-in's text and metadata.
    pub drop_in: Option<(String, Entry)>,
}

/// Everything observed.
#[derive(Debug)]
pub struct Observed {
    /// Users and groups of the node.
    pub accounts: Accounts,
    /// Files of the spec and of the record, by path.
    pub files: BTreeMap<String, FileObs>,
    /// Saved originals of record files that leave the spec: backup name → bytes.
    pub originals: BTreeMap<String, Vec<u8>>,
    /// Kubelet files.
    pub kubelet: KubeletObs,
    /// Kernel-args backend, or why there is none.
    pub kernel: Result<Box<dyn KernelArgsBackend>, NoBackend>,
    /// Running kernel command line (`/proc/cmdline`), if readable.
    pub proc_cmdline: Option<String>,
    /// Sysctls.
    pub sysctls: SysctlObs,
}

/// Errors observing the node (I/O failures other than "absent").
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// Sysroot access failed.
    #[error(transparent)]
    Sysroot(#[from] SysrootError),
    /// State directory access failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// Observes one file path.
pub fn observe_file(root: &Sysroot, path: &str) -> Result<FileObs, SysrootError> {
    match root.parents(path)? {
        Parents::Conflict(c) => return Ok(FileObs::Conflict(c.to_string())),
        Parents::Missing(_) => return Ok(FileObs::Absent),
        Parents::Present => {}
    }
    match root.stat(path)? {
        None => Ok(FileObs::Absent),
        Some(e) if e.kind == Kind::File => {
            let content = root.read(path)?.unwrap_or_default();
            Ok(FileObs::File { content, entry: e })
        }
        Some(e) => Ok(FileObs::Conflict(match e.kind {
            Kind::Symlink => {
                format!("{path} is a symlink; inplaced never follows symlinks in managed paths")
            }
            k => format!("{path} is a {}, not a regular file", k.describe()),
        })),
    }
}

fn text_file(root: &Sysroot, path: &str) -> Result<Option<(String, Entry)>, SysrootError> {
    match observe_file(root, path)? {
        FileObs::File { content, entry } => Ok(Some((
            String::from_utf8_lossy(&content).into_owned(),
            entry,
        ))),
        _ => Ok(None),
    }
}

/// `/proc/sys/...` of a sysctl key, as sysctl(8) maps it: the slashed form
/// (`net/ipv4/conf/eth0.100/rp_filter`, needed when a component holds a dot) is used as
/// is; in the dotted form (`vm.max_map_count`) every dot separates components.
pub fn sysctl_path(key: &str) -> String {
    if key.contains('/') {
        format!("/proc/sys/{key}")
    } else {
        format!("/proc/sys/{}", key.replace('.', "/"))
    }
}

/// Reads what the planner needs for `desired` and `record`.
pub fn observe(
    root: &Sysroot,
    state: &StateDir,
    config: &Config,
    desired: &NodeSpec,
    record: &AppliedRecord,
) -> Result<Observed, ObserveError> {
    let accounts = Accounts::parse(
        &root
            .read_string_following("/etc/passwd")?
            .unwrap_or_default(),
        &root
            .read_string_following("/etc/group")?
            .unwrap_or_default(),
    );
    let mut files = BTreeMap::new();
    let mut originals = BTreeMap::new();
    for f in &desired.files {
        files.insert(f.path.clone(), observe_file(root, &f.path)?);
    }
    for (path, m) in &record.files {
        if !files.contains_key(path) {
            files.insert(path.clone(), observe_file(root, path)?);
            if let Original::Saved { backup, .. } = &m.original
                && let Some(b) = state.read_original(backup)?
            {
                originals.insert(backup.clone(), b);
            }
        }
    }

    let mut kubelet = KubeletObs::default();
    let wants_kubelet = desired.kubelet_config.is_some()
        || !desired.kubelet_flags.is_empty()
        || !record.kubelet_config.is_empty()
        || !record.kubelet_flags.is_empty();
    if wants_kubelet {
        kubelet.config = text_file(root, &config.kubelet.config_path)?;
        kubelet.flags = text_file(root, &config.kubelet.flags_path)?;
        for p in &config.kubelet.extra_args_paths {
            if let Some((t, _)) = text_file(root, p)? {
                match crate::kubelet::flags::parse(&t, "KUBELET_EXTRA_ARGS") {
                    Ok(Some(flags)) => kubelet.extra_args.push((p.clone(), flags)),
                    Ok(None) => {}
                    Err(e) => kubelet.problems.push(format!("{p}: {e}")),
                }
            }
        }
    }

    let kernel = if desired.kernel_args.is_empty() && record.kernel_args.is_empty() {
        Err(NoBackend("no kernel arguments managed".into()))
    } else {
        bootloader::detect(root, config.kernel_args.backend)
    };
    let proc_cmdline = root
        .read_string("/proc/cmdline")
        .ok()
        .flatten()
        .map(|s| s.trim_end().to_string());

    let mut sysctls = SysctlObs::default();
    if !desired.sysctls.is_empty() || !record.sysctls.is_empty() {
        for key in desired.sysctls.keys().chain(record.sysctls.keys()) {
            let p = sysctl_path(key);
            let v = match root.read_string(&p) {
                Ok(v) => v.map(|s| s.trim_end_matches('\n').to_string()),
                Err(SysrootError::Symlink { .. }) | Err(SysrootError::NotADirectory { .. }) => None,
                Err(e) => return Err(e.into()),
            };
            sysctls.live.insert(key.clone(), v);
        }
        sysctls.drop_in = text_file(root, &config.sysctl.drop_in)?;
    }

    Ok(Observed {
        accounts,
        files,
        originals,
        kubelet,
        kernel,
        proc_cmdline,
        sysctls,
    })
}
