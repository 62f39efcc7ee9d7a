//! Observed state: everything the planner needs from the node, read once through the
//! sysroot, so that [`super::plan`] is a pure function.

use std::collections::BTreeMap;

use crate::bootloader::{self, KernelArgsBackend, NoBackend};
use crate::config::Config;
use crate::node::accounts::Accounts;
use crate::node::sysroot::{Entry, Kind, Sysroot, SysrootError};
use crate::spec::NodeSpec;
use crate::state::{AppliedRecord, Original, StateDir, StateError};

/// Largest file the agent reads or writes as a managed file (64 MiB): a node agent must
/// not copy a disk image into memory because a spec named it.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

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
    /// Can not be written: a parent is a file or symlink, or the path is a dir/symlink, or
    /// it is too large.
    Conflict(String),
}

impl FileObs {
    /// `sha256:<hex>` of the content, `absent`, or the conflict.
    pub fn fingerprint(&self) -> String {
        match self {
            FileObs::File { content, .. } => format!("sha256:{}", crate::spec::sha256_hex(content)),
            FileObs::Absent => "absent".into(),
            FileObs::Conflict(c) => c.clone(),
        }
    }
}

/// A text configuration file as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextObs {
    /// Absent.
    Absent,
    /// UTF-8 text with its metadata.
    Text(String, Entry),
    /// Present but unusable (symlink, not UTF-8, too large...), with the reason.
    Problem(String),
}

impl TextObs {
    /// The text and metadata when usable.
    pub fn text(&self) -> Option<(&str, Entry)> {
        match self {
            TextObs::Text(t, e) => Some((t.as_str(), *e)),
            _ => None,
        }
    }

    /// The fingerprint a commit checks before writing (see [`FileObs::fingerprint`]).
    pub fn fingerprint(&self) -> String {
        match self {
            TextObs::Text(t, _) => format!("sha256:{}", crate::spec::sha256_hex(t.as_bytes())),
            TextObs::Absent => "absent".into(),
            TextObs::Problem(p) => p.clone(),
        }
    }
}

/// Kubelet files as observed.
#[derive(Debug, Clone)]
pub struct KubeletObs {
    /// The KubeletConfiguration file.
    pub config: TextObs,
    /// kubeadm's flags env file.
    pub flags: TextObs,
    /// `KUBELET_EXTRA_ARGS` per override file that exists: path → flags.
    pub extra_args: Vec<(String, Vec<crate::kubelet::flags::Flag>)>,
    /// Override files that could not be read or parsed.
    pub problems: Vec<String>,
}

/// A live kernel parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlLive {
    /// Current value (trailing newline removed).
    pub value: String,
    /// Whether the file under /proc/sys is writable at all.
    pub writable: bool,
}

/// Sysctls as observed.
#[derive(Debug, Clone, Default)]
pub struct SysctlObs {
    /// Live values of the managed keys and of the keys of managed sysctl.d files
    /// (None = no such kernel parameter).
    pub live: BTreeMap<String, Option<SysctlLive>>,
    /// The agent's drop-in.
    pub drop_in: Option<TextObs>,
    /// Every sysctl.d file systemd-sysctl would read, in the order it applies them
    /// (node path, text); for a repeated name the /etc copy masks /run and /usr/lib.
    pub files: Vec<(String, String)>,
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
    /// Boot id (`/proc/sys/kernel/random/boot_id`), if readable.
    pub boot_id: Option<String>,
    /// Sysctls.
    pub sysctls: SysctlObs,
    /// Whether kernel arguments are in play (desired or recorded).
    pub kernel_args_managed: bool,
    /// The time daemon when the spec manages `ntp`: the daemon found, or what was looked
    /// for ([`crate::ntp::detect`]); its file is in `files`.
    pub ntp: Option<Result<crate::ntp::Daemon, String>>,
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

/// Observes one file path (never following symlinks, never reading more than
/// [`MAX_FILE_BYTES`]).
pub fn observe_file(root: &Sysroot, path: &str) -> Result<FileObs, SysrootError> {
    use crate::node::sysroot::Probe;
    Ok(match root.probe(path, MAX_FILE_BYTES)? {
        Probe::Absent => FileObs::Absent,
        Probe::ParentConflict(c) => FileObs::Conflict(c.to_string()),
        Probe::Present {
            entry,
            content: Some(content),
        } => FileObs::File { content, entry },
        Probe::Present {
            entry,
            content: None,
        } => FileObs::Conflict(match entry.kind {
            Kind::File => format!(
                "{path} is {} bytes, larger than the {} MiB inplaced manages",
                entry.len,
                MAX_FILE_BYTES >> 20
            ),
            Kind::Symlink => format!(
                "{path} is a symlink; inplaced never follows symlinks in managed paths (manage the file it points to instead)"
            ),
            k => format!("{path} is a {}, not a regular file", k.describe()),
        }),
    })
}

/// Observes a text configuration file.
pub fn observe_text(root: &Sysroot, path: &str) -> Result<TextObs, SysrootError> {
    Ok(match observe_file(root, path)? {
        FileObs::Absent => TextObs::Absent,
        FileObs::Conflict(c) => TextObs::Problem(c),
        FileObs::File { content, entry } => match String::from_utf8(content) {
            Ok(t) => TextObs::Text(t, entry),
            Err(_) => TextObs::Problem(format!(
                "{path} is not UTF-8 text; inplaced edits only text it can keep byte for byte"
            )),
        },
    })
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

/// Directories systemd-sysctl reads, highest priority first (`sysctl.d(5)`).
pub const SYSCTL_DIRS: &[&str] = &[
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
];

/// True for a path systemd-sysctl reads at boot.
pub fn is_sysctl_conf(path: &str) -> bool {
    SYSCTL_DIRS.iter().any(|d| {
        path.strip_prefix(d)
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|n| !n.contains('/') && n.ends_with(".conf"))
    })
}

fn read_live(root: &Sysroot, key: &str) -> Result<Option<SysctlLive>, SysrootError> {
    let p = sysctl_path(key);
    if crate::node::sysroot::components(&p).is_err() {
        return Ok(None);
    }
    let entry = match root.stat(&p) {
        Ok(Some(e)) if e.kind == Kind::File => e,
        Ok(_) | Err(SysrootError::Symlink { .. }) | Err(SysrootError::NotADirectory { .. }) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let value = root
        .read_string(&p)?
        .unwrap_or_default()
        .trim_end_matches('\n')
        .to_string();
    Ok(Some(SysctlLive {
        value,
        writable: entry.mode & 0o222 != 0,
    }))
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
    for d in &desired.dropins {
        let path = d.path();
        let obs = observe_file(root, &path)?;
        files.insert(path, obs);
    }
    let ntp = desired.ntp.as_ref().map(|_| {
        // a path that can not be looked at (a symlinked /lib) counts as absent; the other
        // candidates are tried
        crate::ntp::detect(|p| matches!(root.stat(p), Ok(Some(_))))
    });
    if let Some(Ok(d)) = &ntp
        && !files.contains_key(d.path)
    {
        files.insert(d.path.to_string(), observe_file(root, d.path)?);
    }
    for (path, m) in &record.files {
        if !files.contains_key(path) {
            files.insert(path.clone(), observe_file(root, path)?);
        }
        if let Original::Saved { backup, .. } = &m.original
            && let Some(b) = state.read_original(backup)?
        {
            originals.insert(backup.clone(), b);
        }
    }

    let mut kubelet = KubeletObs {
        config: TextObs::Absent,
        flags: TextObs::Absent,
        extra_args: Vec::new(),
        problems: Vec::new(),
    };
    let wants_kubelet = desired.kubelet_config.is_some()
        || !desired.kubelet_flags.is_empty()
        || !record.kubelet_config.is_empty()
        || !record.kubelet_flags.is_empty();
    if wants_kubelet {
        kubelet.config = observe_text(root, &config.kubelet.config_path)?;
        kubelet.flags = observe_text(root, &config.kubelet.flags_path)?;
        for p in &config.kubelet.extra_args_paths {
            match observe_text(root, p)? {
                TextObs::Absent => {}
                TextObs::Problem(e) => kubelet.problems.push(e),
                TextObs::Text(t, _) => match crate::kubelet::flags::parse(&t, "KUBELET_EXTRA_ARGS")
                {
                    Ok(Some(flags)) => kubelet.extra_args.push((p.clone(), flags)),
                    Ok(None) => {}
                    Err(e) => kubelet.problems.push(format!("{p}: {e}")),
                },
            }
        }
    }

    // the backend is always detected: its files are reserved even when no kernel
    // argument is managed
    let kernel = bootloader::detect(root, config.kernel_args.backend);
    let proc_cmdline = root
        .read_string("/proc/cmdline")
        .ok()
        .flatten()
        .map(|s| s.trim_end().to_string());

    let boot_id = root
        .read_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .flatten()
        .map(|s| s.trim().to_string());

    let mut sysctls = SysctlObs::default();
    let sysctl_files_in_play = desired.files.iter().any(|f| is_sysctl_conf(&f.path))
        || record.files.keys().any(|p| is_sysctl_conf(p));
    if !desired.sysctls.is_empty() || !record.sysctls.is_empty() || sysctl_files_in_play {
        let mut by_name: BTreeMap<String, String> = BTreeMap::new();
        for dir in SYSCTL_DIRS {
            for n in root.list_dir(dir).ok().flatten().unwrap_or_default() {
                if n.ends_with(".conf") {
                    by_name
                        .entry(n.clone())
                        .or_insert_with(|| format!("{dir}/{n}"));
                }
            }
        }
        for (_, p) in by_name {
            let text = match root.read_string_following(&p) {
                Ok(Some(t)) => t,
                _ => continue,
            };
            sysctls.files.push((p, text));
        }
        let mut keys: Vec<String> = desired
            .sysctls
            .keys()
            .chain(record.sysctls.keys())
            .cloned()
            .collect();
        for f in &desired.files {
            if is_sysctl_conf(&f.path) {
                keys.extend(
                    super::parse_sysctl_conf(&String::from_utf8_lossy(&f.content)).into_keys(),
                );
            }
        }
        for (_, t) in &sysctls.files {
            keys.extend(super::parse_sysctl_conf(t).into_keys());
        }
        // originals about to be restored
        for (path, m) in &record.files {
            if let (true, Original::Saved { backup, .. }) = (is_sysctl_conf(path), &m.original)
                && let Some(b) = originals.get(backup)
            {
                keys.extend(super::parse_sysctl_conf(&String::from_utf8_lossy(b)).into_keys());
            }
        }
        for key in keys {
            if let std::collections::btree_map::Entry::Vacant(e) = sysctls.live.entry(key) {
                let v = read_live(root, e.key())?;
                e.insert(v);
            }
        }
        sysctls.drop_in = Some(observe_text(root, &config.sysctl.drop_in)?);
    }

    Ok(Observed {
        accounts,
        files,
        originals,
        kubelet,
        kernel,
        proc_cmdline,
        boot_id,
        sysctls,
        kernel_args_managed: !desired.kernel_args.is_empty()
            || !record.kernel_args.is_empty()
            || !record.kernel_args_removed.is_empty(),
        ntp,
    })
}
