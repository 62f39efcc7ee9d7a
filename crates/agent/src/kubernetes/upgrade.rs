//! The steps of a Kubernetes version upgrade on the node, executed by the operation
//! engine, and their rollback.
//!
//! The order is the kubeadm upgrade guide's
//! (<https://kubernetes.io/docs/tasks/administer-cluster/kubeadm/upgrading-linux-nodes/>,
//! <https://kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-upgrade/>):
//!
//! 1. fetch and verify every binary first (`url`: streamed to the staging directory,
//!    upstream's sigstore signature and the `.sha256` checked, see [`super::fetch`]), so
//!    that a bad download refuses before anything changed;
//! 2. install kubeadm of the target version (`upgrading kubeadm`), checked with
//!    `kubeadm version -o short`;
//! 3. `kubeadm upgrade node` (`kubeadm upgrade node`): on a control-plane node it
//!    upgrades the static Pods (and etcd) from the cluster's ClusterConfiguration, on a
//!    worker it rewrites the kubelet configuration. Not `kubeadm upgrade apply`: KCP has
//!    already updated the `kubeadm-config` ClusterConfiguration, the kubelet ConfigMap,
//!    CoreDNS and kube-proxy before it updates Machines (upstream
//!    `controlplane/kubeadm/internal/controllers/upgrade.go`);
//! 4. install the kubelet (and kubectl) of the target version (`upgrading kubelet`),
//!    each checked to report the target (`kubelet --version`, `kubectl version
//!    --client`) before the kubelet runs on it;
//! 5. `systemctl daemon-reload`, restart the kubelet (`restarting kubelet`);
//! 6. the health gate: the kubelet's health check, and `kubelet --version` is the target;
//! 7. on a control-plane node, the static Pod manifests name the target's image tag.
//!
//! Each completed step leaves a [`Restore`] the engine keeps in its undo list: the
//! previous binaries and kubelet files are written back, package installs are reverted
//! to the previous version, and the kubelet restarted last.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom};
use std::path::Path;

use super::config::{KubernetesConfig, SourceKind};
use super::fetch::{Staged, Staging, Verification};
use super::{CONTROL_PLANE_COMPONENTS, Version, source, tail};
use inplace_node::sysroot::{Durability, Entry, Sysroot};
use inplace_node::system::{CommandRunner, ServiceManager};

/// An upgrade the plan asks for (the kubernetes section's effect, `sections::kubernetes::effects`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Upgrade {
    /// The node's version (its kubelet's).
    pub from: Version,
    /// The target version.
    pub to: Version,
    /// A control-plane node (it has the kube-apiserver static Pod).
    pub control_plane: bool,
    /// Kubelet files `kubeadm upgrade node` rewrites, restored on rollback (node paths).
    pub kubelet_files: Vec<String>,
}

/// Binaries fetched and verified before anything is installed: name → staging file
/// (none for a package source, where the package manager fetches). The staging files
/// are removed when this is dropped.
#[derive(Debug, Default)]
pub(crate) struct Fetched {
    files: BTreeMap<String, Staged>,
    staging: Option<Staging>,
    described: String,
}

/// How to undo one completed step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Restore {
    /// Write the file back (None: remove it).
    File(String, Option<(Vec<u8>, Entry)>),
    /// Write the file back from a copy kept on the node (the backup of a replaced
    /// binary), streamed: a binary is never held in memory for its undo.
    Copy {
        /// The node path to restore.
        path: String,
        /// The node path of the copy.
        from: String,
        /// The mode and owner to restore.
        entry: Entry,
    },
    /// Run a command (a package install of the previous version).
    Command(Vec<String>),
    /// Restart the unit (the kubelet, with the restored files).
    Restart(String),
    /// Remove a directory the step created, if empty.
    Dir(String),
    /// A step that can not be undone (`kubeadm upgrade node` on a control-plane node:
    /// the static Pod manifests and etcd it upgraded): its undo fails with this text, so
    /// the rollback is reported incomplete rather than complete.
    Irreversible(String),
}

impl Restore {
    /// What the undo does, for the operation's actions; never a file's content.
    pub(crate) fn describe(&self) -> String {
        match self {
            Restore::File(p, Some(_)) => format!("restored {p}"),
            Restore::File(p, None) => format!("removed {p}"),
            Restore::Copy { path, from, .. } => format!("restored {path} from {from}"),
            Restore::Command(argv) => format!("ran {}", argv.join(" ")),
            Restore::Restart(u) => format!("restarted {u}"),
            Restore::Dir(d) => format!("removed directory {d} if empty"),
            Restore::Irreversible(what) => format!("not undone: {what}"),
        }
    }

    /// Undoes the step; the error names the file, command or unit.
    pub(crate) fn undo(
        &self,
        root: &Sysroot,
        services: &dyn ServiceManager,
        runner: &dyn CommandRunner,
    ) -> Result<(), String> {
        match self {
            Restore::File(path, Some((content, e))) => root
                .write_atomic(path, content, e.mode, e.uid, e.gid)
                .map(|_| ())
                .map_err(|e| format!("{path}: {e}")),
            Restore::File(path, None) => root
                .remove(path)
                .map(|_| ())
                .map_err(|e| format!("{path}: {e}")),
            Restore::Copy { path, from, entry } => {
                let mut src = root
                    .open_read(from)
                    .map_err(|e| format!("{from}: {e}"))?
                    .ok_or_else(|| format!("{from} is gone, {path} can not be restored"))?;
                root.write_atomic_from(
                    path,
                    &mut src,
                    entry.mode,
                    entry.uid,
                    entry.gid,
                    Durability::Durable,
                )
                .map(|_| ())
                .map_err(|e| format!("{path}: {e}"))
            }
            Restore::Command(argv) => runner.run(argv).map(|_| ()).map_err(|e| e.to_string()),
            Restore::Restart(unit) => services.restart(unit).map_err(|e| e.to_string()),
            Restore::Dir(d) => root
                .remove_dir_if_empty(d)
                .map(|_| ())
                .map_err(|e| format!("{d}: {e}")),
            Restore::Irreversible(what) => Err(format!("not undone: {what}")),
        }
    }
}

/// What the steps act with.
pub(crate) struct Host<'a> {
    /// The node's root.
    pub root: &'a Sysroot,
    /// systemd.
    pub services: &'a dyn ServiceManager,
    /// Commands (kubeadm, kubelet --version, the package manager).
    pub runner: &'a dyn CommandRunner,
    /// `[kubernetes]`.
    pub config: &'a KubernetesConfig,
    /// The kubelet's unit.
    pub kubelet_unit: &'a str,
    /// The kubelet's health check after its restart.
    pub health: &'a dyn Fn() -> Result<(), String>,
}

impl std::fmt::Debug for Host<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("root", &self.root).finish()
    }
}

/// Where the engine follows an upgrade: the phase message, the journal, the actions.
pub(crate) trait Progress {
    /// A new step begins: `upgrading kubeadm`, `kubeadm upgrade node`, `restarting
    /// kubelet`. An error (the journal could not record it) stops the upgrade before the
    /// step: its message is the upgrade's error.
    fn step(&mut self, message: &str) -> Result<(), String>;
    /// A step completed (journaled and listed in the operation's actions).
    fn done(&mut self, action: String);
}

/// Fetches and verifies every binary of `up.to` into the staging directory under
/// `state_dir` (nothing on the node changes). For a package source nothing is fetched
/// here. With `kubernetes.verify_signatures = false` each download logs a warning.
pub(crate) fn fetch(
    up: &Upgrade,
    config: &KubernetesConfig,
    state_dir: &Path,
) -> Result<Fetched, String> {
    let mut out = Fetched::default();
    if config.source != SourceKind::Url {
        return Ok(out);
    }
    let verification = Verification::from_config(config).map_err(|e| e.to_string())?;
    if matches!(verification, Verification::ChecksumOnly) {
        tracing::warn!(
            version = %up.to,
            "kubernetes.verify_signatures = false: the binaries are checked only against the mirror's own .sha256, not authenticated"
        );
    }
    let client = super::fetch::Client::new(config).map_err(|e| e.to_string())?;
    let mut staging = Staging::open(state_dir).map_err(|e| e.to_string())?;
    for b in config.binaries() {
        let url = source::binary_url(config, up.to, b);
        let staged = client
            .fetch_verified(&url, &mut staging, b, &verification)
            .map_err(|e| e.to_string())?;
        out.files.insert(b.to_string(), staged);
    }
    out.staging = Some(staging);
    out.described = super::fetch::describe(config);
    Ok(out)
}

/// Runs the steps of `up` after [`fetch`]; every completed step pushes its [`Restore`]
/// on `undo` (the kubelet's restart first, so that undoing in reverse restarts it last,
/// with the restored files). The error names the failing step and its output's tail.
pub(crate) fn run(
    up: &Upgrade,
    fetched: &Fetched,
    host: &Host<'_>,
    progress: &mut dyn Progress,
    undo: &mut Vec<Restore>,
) -> Result<(), String> {
    let cfg = host.config;
    undo.push(Restore::Restart(host.kubelet_unit.to_string()));
    progress.step(&format!("upgrading kubeadm to {}", up.to))?;
    install(up, fetched, host, &["kubeadm"], progress, undo)?;
    let kubeadm = cfg.bin_path("kubeadm");
    let out = query(host, &[&kubeadm, "version", "-o", "short"])?;
    check_version("kubeadm", super::parse_kubeadm_version(&out), up.to)?;
    progress.step("kubeadm upgrade node")?;
    for f in &up.kubelet_files {
        undo.push(Restore::File(f.clone(), snapshot(host.root, f)?));
    }
    if up.control_plane {
        undo.push(Restore::Irreversible(format!(
            "kubeadm upgrade node upgraded the control-plane static Pods ({}) and etcd from the cluster's ClusterConfiguration; kubeadm keeps the manifests before in /etc/kubernetes/tmp/kubeadm-backup-manifests-*",
            cfg.manifests_dir
        )));
    }
    let argv = vec![kubeadm.clone(), "upgrade".into(), "node".into()];
    host.runner
        .run(&argv)
        .map_err(|e| format!("kubeadm upgrade node failed: {}", tail(&e.detail, 600)))?;
    progress.done(format!("ran {kubeadm} upgrade node"));
    progress.step(&format!("upgrading kubelet to {}", up.to))?;
    let rest: Vec<&str> = cfg
        .binaries()
        .into_iter()
        .filter(|b| *b != "kubeadm")
        .collect();
    install(up, fetched, host, &rest, progress, undo)?;
    // Before the kubelet runs on it: each installed binary reports the target. A
    // signature covers the bytes, not the file name or the version, so a mirror could
    // serve another release's (or another binary's) signed bytes at this path.
    installed_versions(host, &rest, up.to)?;
    progress.done(format!("installed {} report {}", rest.join(", "), up.to));
    host.services
        .daemon_reload()
        .map_err(|e| format!("daemon-reload: {e}"))?;
    progress.done("daemon-reload".into());
    progress.step("restarting kubelet")?;
    host.services
        .restart(host.kubelet_unit)
        .map_err(|e| format!("restarting the kubelet: {e}"))?;
    progress.done(format!("restarted {}", host.kubelet_unit));
    (host.health)().map_err(|e| format!("kubelet health check failed: {e}"))?;
    let out = query(host, &[&cfg.bin_path("kubelet"), "--version"])?;
    check_version("kubelet", super::parse_kubelet_version(&out), up.to)?;
    progress.done(format!("kubelet healthy, reports {}", up.to));
    if up.control_plane {
        verify_manifests(host.root, cfg, up.to)?;
        progress.done(format!("static Pod manifests name {}", up.to));
    }
    Ok(())
}

/// Asks each of `bins` (kubelet, kubectl) installed at the configured paths for its
/// version and checks it is `want`: `kubelet --version`, `kubectl version --client`.
fn installed_versions(host: &Host<'_>, bins: &[&str], want: Version) -> Result<(), String> {
    let cfg = host.config;
    for b in bins {
        let path = cfg.bin_path(b);
        match *b {
            "kubelet" => {
                let out = query(host, &[&path, "--version"])?;
                check_version("kubelet", super::parse_kubelet_version(&out), want)?;
            }
            "kubectl" => {
                let out = query(host, &[&path, "version", "--client"])?;
                check_version("kubectl", super::parse_kubectl_version(&out), want)?;
            }
            _ => {}
        }
    }
    Ok(())
}

fn query(host: &Host<'_>, argv: &[&str]) -> Result<String, String> {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    host.runner.query(&argv).map_err(|e| e.to_string())
}

fn check_version(what: &str, got: Result<Version, String>, want: Version) -> Result<(), String> {
    match got {
        Ok(v) if v == want => Ok(()),
        Ok(v) => Err(format!(
            "the installed {what} reports {v}, not the target {want}"
        )),
        Err(e) => Err(format!("the installed {what}: {e}")),
    }
}

/// The file's content and metadata now (None: absent).
fn snapshot(root: &Sysroot, path: &str) -> Result<Option<(Vec<u8>, Entry)>, String> {
    let Some(entry) = root.stat(path).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let content = root
        .read(path)
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    Ok(Some((content, entry)))
}

/// Installs `bins` of the target version from the configured source.
fn install(
    up: &Upgrade,
    fetched: &Fetched,
    host: &Host<'_>,
    bins: &[&str],
    progress: &mut dyn Progress,
    undo: &mut Vec<Restore>,
) -> Result<(), String> {
    if bins.is_empty() {
        return Ok(());
    }
    match host.config.source {
        SourceKind::Url => {
            for b in bins {
                let staged = fetched
                    .files
                    .get(*b)
                    .ok_or_else(|| format!("{b} of {} was not fetched", up.to))?;
                progress.done(format!(
                    "verified {b} {} (SHA-256 {}, {} bytes): {}",
                    up.to, staged.sha256, staged.size, fetched.described
                ));
                install_file(up, host, b, staged, progress, undo)?;
            }
            Ok(())
        }
        SourceKind::Apt | SourceKind::Dnf => install_packages(up, host, bins, progress, undo),
        SourceKind::None => Err("kubernetes.source is not set".into()),
    }
}

/// Installs one binary atomically (0755 root), streamed from its staging file, the
/// previous one kept in the backup directory as `<binary>-<old version>`.
fn install_file(
    up: &Upgrade,
    host: &Host<'_>,
    bin: &str,
    staged: &Staged,
    progress: &mut dyn Progress,
    undo: &mut Vec<Restore>,
) -> Result<(), String> {
    let cfg = host.config;
    let path = cfg.bin_path(bin);
    let before = host.root.stat(&path).map_err(|e| e.to_string())?;
    let undo_install = match &before {
        Some(e) => {
            let backup = format!("{}/{bin}-{}", cfg.backup_dir.trim_end_matches('/'), up.from);
            // an older copy under that name (rare: an earlier upgrade from the same
            // version) is kept in memory for its undo; the binary itself is streamed
            let prev = snapshot(host.root, &backup)?;
            let mut src = host
                .root
                .open_read(&path)
                .map_err(|e| format!("saving the previous {bin}: {e}"))?
                .ok_or_else(|| format!("saving the previous {bin}: {path} is gone"))?;
            let created = host
                .root
                .write_atomic_from(&backup, &mut src, e.mode, e.uid, e.gid, Durability::Durable)
                .map_err(|e| format!("saving the previous {bin}: {e}"))?;
            undo.extend(created.into_iter().map(Restore::Dir));
            undo.push(Restore::File(backup.clone(), prev));
            progress.done(format!("saved the previous {path} as {backup}"));
            Restore::Copy {
                path: path.clone(),
                from: backup,
                entry: *e,
            }
        }
        None => Restore::File(path.clone(), None),
    };
    let mut file = &staged.file;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| format!("installing {path}: reading the staging file: {e}"))?;
    let created = host
        .root
        .write_atomic_from(&path, &mut file, 0o755, 0, 0, Durability::Durable)
        .map_err(|e| format!("installing {path}: {e}"))?;
    undo.extend(created.into_iter().map(Restore::Dir));
    undo.push(undo_install);
    progress.done(format!("installed {path} {} (0755 0:0)", up.to));
    Ok(())
}

/// Installs packages `bins` at the target version through apt or dnf, the holds or
/// versionlocks put back as they were; the undo installs the previous version.
fn install_packages(
    up: &Upgrade,
    host: &Host<'_>,
    bins: &[&str],
    progress: &mut dyn Progress,
    undo: &mut Vec<Restore>,
) -> Result<(), String> {
    let cfg = host.config;
    let (now, back) = match cfg.source {
        SourceKind::Apt => {
            let held = source::parse_holds(&query(host, &["apt-mark", "showhold"])?);
            (
                source::apt_install(cfg, bins, up.to, &held),
                source::apt_install(cfg, bins, up.from, &held),
            )
        }
        _ => {
            let out = query(host, &["dnf", "versionlock", "list"]).unwrap_or_default();
            let locked = source::parse_versionlocks(&out, bins);
            (
                source::dnf_install(bins, up.to, &locked),
                source::dnf_install(bins, up.from, &locked),
            )
        }
    };
    for argv in back.into_iter().rev() {
        undo.push(Restore::Command(argv));
    }
    for argv in &now {
        host.runner
            .run(argv)
            .map_err(|e| format!("{}: {}", argv.join(" "), tail(&e.detail, 600)))?;
        progress.done(format!("ran {}", argv.join(" ")));
    }
    Ok(())
}

/// On a control-plane node: every control-plane component's manifest names the target
/// version's image tag.
fn verify_manifests(root: &Sysroot, cfg: &KubernetesConfig, to: Version) -> Result<(), String> {
    for c in CONTROL_PLANE_COMPONENTS {
        let path = format!("{}/{c}.yaml", cfg.manifests_dir.trim_end_matches('/'));
        let text = root
            .read_string(&path)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{path} is missing after kubeadm upgrade node"))?;
        let tags = super::manifest_tags(&text);
        let want = to.to_string();
        if !tags
            .iter()
            .any(|(img, tag)| img.ends_with(c) && *tag == want)
        {
            return Err(format!(
                "{path} names {} after kubeadm upgrade node, not {want}",
                tags.iter()
                    .map(|(i, t)| format!("{i}:{t}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(())
}
