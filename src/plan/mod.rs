//! Planning: the diff between the desired spec, the observed node and the applied record,
//! as a coverage report plus the exact steps that converge the node.
//!
//! [`plan`] is a pure function of its inputs (no I/O, no clock), so the same inputs give a
//! byte-identical report. Each change has a stable id (`files[/etc/x]`,
//! `kubelet.config.maxPods`, `kubelet.flags[max-pods]`, `kernelArgs[isolcpus]`,
//! `sysctls[vm.max_map_count]`, `ntp`, `dropins[10-x.yaml]`), and changes are sorted by id.
//!
//! The `ntp` section and the node.d drop-ins are written through the same file machinery
//! as `files` (atomic write, ownership record, revert when dropped), each as one file item
//! with its own change id: `ntp` edits chrony's config or writes the timesyncd drop-in
//! (restart of the daemon's unit); `dropins[<name>]` writes
//! `/etc/inplaced/node.d/<name>` (no disruption; the agent's own area, so the write
//! policy does not apply; dropping it deletes the file).
//!
//! Ownership rules (DESIGN §2): an item dropped from the spec is reverted to what was there
//! before the agent changed it (a created file is deleted, an overwritten one restored from
//! its saved original, a kubelet field or flag or sysctl set back to its prior value, a
//! kernel argument the agent added removed); nothing the agent did not add is touched.

pub mod observe;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::cmdline::{Arg, Cmdline};
use crate::config::Config;
use crate::kubelet::config::{self as kcfg, LeafEdit};
use crate::kubelet::fields as kcfg_fields;
use crate::kubelet::flags::{self as kflags};
use crate::node::accounts::IdRef;
use crate::node::sysroot::Entry;
use crate::pb::{self, ChangeOperation, DisruptionLevel};
use crate::spec::{FileSpec, NodeSpec, sha256_hex};
use crate::state::{AppliedRecord, ManagedField, ManagedFile, ManagedValue, Original, backup_name};
pub use observe::{FileObs, Observed, observe};

/// One durable file write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Node path.
    pub path: String,
    /// Full content.
    pub content: Vec<u8>,
    /// Mode (0o7777 mask).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Keep the existing file's mode and owner (configuration files edited in place);
    /// `mode`, `uid`, `gid` apply only when the file is created.
    pub keep_meta: bool,
    /// What the file must still be at commit time ([`FileObs::fingerprint`]): a commit
    /// never overwrites a change made after the plan.
    pub expect: String,
    /// Original content to save under `originals/` before the first overwrite.
    pub save_original: Option<Vec<u8>>,
    /// Part of the `files` section (its created directories are recorded).
    pub managed_file: bool,
}

/// One file deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remove {
    /// Node path.
    pub path: String,
    /// Fingerprint the file must still have.
    pub expect: String,
    /// Directories the agent created for it, deepest first, removed when empty.
    pub dirs: Vec<String>,
}

/// Everything an apply does, in order of execution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Steps {
    /// Files written (files section, kubelet files, boot configuration, sysctl drop-in).
    pub writes: Vec<Write>,
    /// Files deleted.
    pub removes: Vec<Remove>,
    /// Live sysctl writes: key, value.
    pub sysctls: Vec<(String, String)>,
    /// Commands run after the writes (boot configuration regeneration).
    pub commands: Vec<Vec<String>>,
    /// `systemctl daemon-reload` needed.
    pub daemon_reload: bool,
    /// Units to reload.
    pub reloads: BTreeSet<String>,
    /// Units to restart.
    pub restarts: BTreeSet<String>,
    /// Units to restart only if running (`systemctl try-restart`), after a daemon-reload.
    pub try_restarts: BTreeSet<String>,
    /// Kubelet state files to delete between stopping and starting the kubelet (CPU and
    /// memory manager checkpoints, which the kubelet refuses when their policy changed).
    pub kubelet_state_reset: BTreeSet<String>,
    /// A reboot is needed to take effect.
    pub reboot: bool,
    /// Kernel arguments are changed by a tool (rpm-ostree), so they can only be verified
    /// after the boot, in `/proc/cmdline`.
    pub kernel_args_by_command: bool,
    /// Saved originals no longer needed after the commit.
    pub drop_originals: Vec<String>,
}

/// A plan: the report and the steps.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Coverage report (facts and preservation are filled by the caller).
    pub report: pb::CoverageReport,
    /// Steps that converge the node.
    pub steps: Steps,
    /// The applied record once the steps are committed.
    pub record: AppliedRecord,
}

/// Inputs that are not the spec, the node or the record.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Reboot policy FORBIDDEN: changes needing a reboot are not covered.
    pub reboot_forbidden: bool,
    /// Node paths the `files` section may not write, with the owner to name (the agent's
    /// own state directory when it lies inside the sysroot).
    pub reserved: Vec<(String, String)>,
    /// node.d drop-in paths to leave as they are on the node (a drop-in file that does not
    /// parse, whose last applied version stays in effect): neither written nor removed,
    /// their record entries carried over.
    pub leave_files: Vec<String>,
}

/// A file the plan writes: an item of the `files` section, or of a section that reuses
/// the file machinery (`ntp`, `dropins`).
struct FileItem<'a> {
    file: Cow<'a, FileSpec>,
    /// Change id.
    id: String,
    /// Marker kept in the record ([`ManagedFile::item`]); None for `files`.
    item: Option<String>,
    /// Disruption and reason instead of the path rules.
    disruption: Option<(pb::Disruption, String)>,
    /// Before and after summaries instead of the content hashes (server lists for ntp).
    summary: Option<(String, String)>,
    /// The agent's own area (node.d): reserved paths and the write policy do not apply,
    /// no original is saved, and dropping the item deletes the file.
    agent_owned: bool,
}

/// Disruption of a file written for `item` (a record marker) at `path`, when it is not
/// a `files` item: a restart of the time daemon for `ntp`, none for a drop-in.
fn item_disruption(item: &str, path: &str) -> Option<pb::Disruption> {
    if item == "ntp" {
        let unit = crate::ntp::unit_for_path(path)?;
        return Some(disruption(DisruptionLevel::Restart, &[unit]));
    }
    item.starts_with("dropins[")
        .then(|| disruption(DisruptionLevel::None, &[]))
}

/// Server list summary of an ntp file's content (`none` when it names no server).
fn ntp_summary(path: &str, content: &[u8]) -> String {
    let servers = crate::ntp::servers_in(path, &String::from_utf8_lossy(content));
    if servers.is_empty() {
        "none".into()
    } else {
        servers.join(" ")
    }
}

/// The file items of `desired`: its `files`, the ntp file and the drop-ins. A section
/// that can not be written at all (no time daemon, an unreadable chrony.conf) gives a
/// change that is not covered instead.
fn file_items<'a>(desired: &'a NodeSpec, obs: &Observed) -> (Vec<FileItem<'a>>, Vec<pb::Change>) {
    let mut items: Vec<FileItem<'a>> = desired
        .files
        .iter()
        .map(|f| FileItem {
            id: format!("files[{}]", f.path),
            file: Cow::Borrowed(f),
            item: None,
            disruption: None,
            summary: None,
            agent_owned: false,
        })
        .collect();
    let mut refused = Vec::new();
    if let (Some(ntp), Some(found)) = (&desired.ntp, &obs.ntp) {
        let after = ntp.servers.join(" ");
        let not_covered = |reason: String, targets: Vec<String>, d: pb::Disruption| {
            ChangeBuilder {
                id: "ntp".into(),
                op: ChangeOperation::Update,
                before: String::new(),
                after: after.clone(),
                covered: Err(reason),
                disruption: d,
                targets,
            }
            .build()
        };
        match found {
            Err(why) => refused.push(not_covered(
                why.clone(),
                vec![],
                disruption(DisruptionLevel::None, &[]),
            )),
            Ok(daemon) => {
                let restart = disruption(DisruptionLevel::Restart, &[daemon.unit]);
                let obs_file = obs
                    .files
                    .get(daemon.path)
                    .cloned()
                    .unwrap_or(FileObs::Absent);
                let current = match &obs_file {
                    FileObs::File { content, entry } => Ok(Some((content.clone(), *entry))),
                    FileObs::Absent => Ok(None),
                    FileObs::Conflict(c) => Err(c.clone()),
                };
                let built = current.and_then(|cur| {
                    let before = cur
                        .as_ref()
                        .map(|(c, _)| ntp_summary(daemon.path, c))
                        .unwrap_or_else(|| "absent".into());
                    if !daemon.edits_in_place() {
                        let content = crate::ntp::timesyncd_dropin(&ntp.servers).into_bytes();
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
                    let content = crate::ntp::chrony_edit(&text, &ntp.servers).into_bytes();
                    Ok((content, mode, meta, before))
                });
                match built {
                    Err(why) => {
                        refused.push(not_covered(why, vec![daemon.path.to_string()], restart))
                    }
                    Ok((content, mode, owner, before)) => {
                        let reason = if daemon.edits_in_place() {
                            format!(
                                "{}: its server and pool lines are replaced, every other line kept; {} restart",
                                daemon.evidence, daemon.unit
                            )
                        } else {
                            format!(
                                "{}: the drop-in {} sets NTP=; {} restart",
                                daemon.evidence, daemon.path, daemon.unit
                            )
                        };
                        items.push(FileItem {
                            file: Cow::Owned(FileSpec {
                                path: daemon.path.to_string(),
                                sha256: sha256_hex(&content),
                                content,
                                mode,
                                owner: owner.map(|(u, _)| IdRef::Id(u)),
                                group: owner.map(|(_, g)| IdRef::Id(g)),
                            }),
                            id: "ntp".into(),
                            item: Some("ntp".into()),
                            disruption: Some((restart, reason)),
                            summary: Some((before, after)),
                            agent_owned: false,
                        });
                    }
                }
            }
        }
    }
    for d in &desired.dropins {
        let id = format!("dropins[{}]", d.name);
        items.push(FileItem {
            file: Cow::Owned(FileSpec {
                path: d.path(),
                content: d.content.clone().into_bytes(),
                mode: 0o644,
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
        });
    }
    (items, refused)
}

fn disruption(level: DisruptionLevel, units: &[&str]) -> pb::Disruption {
    let mut u: Vec<String> = units.iter().map(|s| s.to_string()).collect();
    u.sort();
    u.dedup();
    pb::Disruption {
        level: level as i32,
        units: u,
    }
}

struct ChangeBuilder<'a> {
    id: String,
    op: ChangeOperation,
    before: String,
    after: String,
    covered: Result<&'a str, String>,
    disruption: pb::Disruption,
    targets: Vec<String>,
}

impl ChangeBuilder<'_> {
    fn build(self) -> pb::Change {
        let (covered, reason) = match self.covered {
            Ok(r) => (true, r.to_string()),
            Err(r) => (false, r),
        };
        let mut targets = self.targets;
        targets.sort();
        targets.dedup();
        pb::Change {
            id: self.id,
            operation: self.op as i32,
            before: self.before,
            after: self.after,
            covered,
            reason,
            disruption: Some(self.disruption),
            targets,
        }
    }
}

fn summary_of(sha_hex: &str, mode: u32, uid: u32, gid: u32) -> String {
    format!("sha256:{sha_hex} mode={mode:04o} uid={uid} gid={gid}")
}

fn file_summary(content: &[u8], mode: u32, uid: u32, gid: u32) -> String {
    format!(
        "sha256:{} mode={mode:04o} uid={uid} gid={gid}",
        sha256_hex(content)
    )
}

fn summary_of_obs(obs: &FileObs) -> String {
    match obs {
        FileObs::File { content, entry } => file_summary(content, entry.mode, entry.uid, entry.gid),
        FileObs::Absent => "absent".into(),
        FileObs::Conflict(c) => c.clone(),
    }
}

fn json_summary(v: Option<&Value>) -> String {
    match v {
        None => "absent".into(),
        Some(v) => serde_json::to_string(v).unwrap_or_default(),
    }
}

/// Kernel-argument changes of one key (compared with `-`/`_` equivalence).
struct KeyChange {
    key: String,
    removed: Vec<Arg>,
    appended: Vec<Arg>,
}

impl KeyChange {
    fn new(key: &str) -> Self {
        KeyChange {
            key: key.to_string(),
            removed: Vec::new(),
            appended: Vec::new(),
        }
    }
}

/// `Update` when the item exists, else `Create`.
fn upsert(exists: bool) -> ChangeOperation {
    if exists {
        ChangeOperation::Update
    } else {
        ChangeOperation::Create
    }
}

/// Built-in disruption of a file, mirroring what systemd and the services need to read a
/// changed file: unit files and drop-ins under `/etc/systemd/system` need
/// `systemctl daemon-reload` and a try-restart of the unit; `/etc/default/kubelet` and
/// `/etc/sysconfig/kubelet` (read by the kubeadm drop-in) a kubelet restart; files under
/// `/etc/containerd` a containerd restart. Returns (level, unit, reason).
pub fn builtin_disruption(
    path: &str,
    kubelet_unit: &str,
) -> Option<(DisruptionLevel, String, String)> {
    const UNIT_SUFFIXES: &[&str] = &[
        ".service",
        ".socket",
        ".timer",
        ".path",
        ".mount",
        ".automount",
        ".swap",
        ".target",
        ".slice",
    ];
    for dir in [
        "/etc/systemd/system/",
        "/run/systemd/system/",
        "/usr/lib/systemd/system/",
        "/lib/systemd/system/",
    ] {
        let Some(rest) = path.strip_prefix(dir) else {
            continue;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        match parts.as_slice() {
            [unit] if UNIT_SUFFIXES.iter().any(|s| unit.ends_with(s)) => {
                return Some((
                    DisruptionLevel::DaemonReload,
                    unit.to_string(),
                    format!(
                        "a unit file: systemctl daemon-reload, then {unit} is restarted if it runs"
                    ),
                ));
            }
            [d, conf] if d.ends_with(".d") && conf.ends_with(".conf") => {
                let unit = d.trim_end_matches(".d");
                if UNIT_SUFFIXES.iter().any(|s| unit.ends_with(s)) {
                    return Some((
                        DisruptionLevel::DaemonReload,
                        unit.to_string(),
                        format!(
                            "a drop-in of {unit}: systemctl daemon-reload, then {unit} is restarted if it runs"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    if path == "/etc/default/kubelet" || path == "/etc/sysconfig/kubelet" {
        return Some((
            DisruptionLevel::Restart,
            kubelet_unit.to_string(),
            "KUBELET_EXTRA_ARGS of the kubeadm drop-in: kubelet restart".into(),
        ));
    }
    if path.starts_with("/etc/containerd/") {
        return Some((
            DisruptionLevel::Restart,
            "containerd.service".into(),
            "containerd configuration: containerd restart".into(),
        ));
    }
    None
}

/// Reason of a change that resets the kubelet's CPU or memory manager.
const RESET_REASON: &str = "changes the CPU, memory or topology manager: drain the node first; the kubelet is stopped, its manager checkpoint (/var/lib/kubelet/cpu_manager_state or memory_manager_state) removed, and started again, as the kubelet requires";

/// Kubelet checkpoints invalidated by a change of these fields (`flags` = kubelet flag
/// names, else KubeletConfiguration field names): the kubelet refuses to start when the
/// CPU or memory manager policy or its reserved set no longer matches its checkpoint. The
/// topology manager's policy, scope and options decide how both managers align their
/// assignments, so a change of them invalidates both checkpoints.
///
/// Returns node paths under `/var/lib/kubelet`, in the order the names ask for them (a
/// path may repeat; callers collect them into a set).
pub fn kubelet_state_files(names: &[&str], flags: bool) -> Vec<String> {
    let mut out = Vec::new();
    for n in names {
        let (cpu, mem) = if flags {
            let topology = matches!(
                *n,
                "topology-manager-policy"
                    | "topology-manager-scope"
                    | "topology-manager-policy-options"
            );
            (
                topology
                    || matches!(
                        *n,
                        "cpu-manager-policy" | "cpu-manager-policy-options" | "reserved-cpus"
                    ),
                topology || matches!(*n, "memory-manager-policy" | "reserved-memory"),
            )
        } else {
            let topology = matches!(
                *n,
                "topologyManagerPolicy" | "topologyManagerScope" | "topologyManagerPolicyOptions"
            );
            (
                topology
                    || matches!(
                        *n,
                        "cpuManagerPolicy" | "cpuManagerPolicyOptions" | "reservedSystemCPUs"
                    ),
                topology || matches!(*n, "memoryManagerPolicy" | "reservedMemory"),
            )
        };
        if cpu {
            out.push("/var/lib/kubelet/cpu_manager_state".to_string());
        }
        if mem {
            out.push("/var/lib/kubelet/memory_manager_state".to_string());
        }
    }
    out
}

/// Change id of a KubeletConfiguration leaf: `kubelet.config.a.b`, with a segment that
/// holds `.`, `[` or `"` quoted (`kubelet.config.evictionHard["memory.available"]`), so ids
/// stay unique.
pub fn config_id(path: &[String]) -> String {
    let mut id = String::from("kubelet.config");
    for seg in path {
        if seg.contains(['.', '[', ']', '"']) || seg.is_empty() {
            id.push_str(&format!(
                "[{}]",
                serde_json::to_string(seg).unwrap_or_default()
            ));
        } else {
            id.push('.');
            id.push_str(seg);
        }
    }
    id
}

struct Planner<'a> {
    desired: &'a NodeSpec,
    /// Files to write, from every section that writes whole files.
    items: Vec<FileItem<'a>>,
    obs: &'a Observed,
    record: &'a AppliedRecord,
    config: &'a Config,
    opts: Options,
    changes: Vec<pb::Change>,
    steps: Steps,
    next: AppliedRecord,
    /// paths owned by sections other than `files`: path → owner
    reserved: BTreeMap<String, String>,
}

/// Computes the plan. Pure: see the module docs.
pub fn plan(
    desired: &NodeSpec,
    obs: &Observed,
    record: &AppliedRecord,
    config: &Config,
    opts: Options,
) -> Plan {
    let spec_hash = desired.hash();
    let mut reserved = BTreeMap::new();
    reserved.insert(
        config.kubelet.config_path.clone(),
        "the kubelet.config section".to_string(),
    );
    reserved.insert(
        config.kubelet.flags_path.clone(),
        "the kubelet.flags section".to_string(),
    );
    reserved.insert(
        config.sysctl.drop_in.clone(),
        "the sysctls section".to_string(),
    );
    if let Ok(b) = &obs.kernel {
        for s in b.sources() {
            reserved.insert(s.path.clone(), "the kernelArgs section".to_string());
        }
    }
    for (p, what) in &opts.reserved {
        reserved.insert(p.clone(), what.clone());
    }
    let (items, refused) = file_items(desired, obs);
    let mut p = Planner {
        desired,
        items,
        obs,
        record,
        config,
        opts,
        changes: refused,
        steps: Steps::default(),
        next: AppliedRecord {
            spec_hash: spec_hash.clone(),
            ..Default::default()
        },
        reserved,
    };
    p.files();
    p.kubelet();
    p.kernel_args();
    p.sysctls();
    p.sysctl_files_live();
    let Planner {
        mut changes,
        steps,
        next,
        ..
    } = p;
    changes.sort_by(|a, b| a.id.cmp(&b.id));
    let fully_covered = changes.iter().all(|c| c.covered);
    let max_level = changes
        .iter()
        .filter_map(|c| c.disruption.as_ref().map(|d| d.level))
        .max()
        .unwrap_or(DisruptionLevel::None as i32);
    let mut units = BTreeSet::new();
    for c in &changes {
        if let Some(d) = &c.disruption
            && d.level <= DisruptionLevel::DaemonReload as i32
        {
            units.extend(d.units.iter().cloned());
        }
    }
    let reboot_required = changes.iter().any(|c| {
        c.disruption
            .as_ref()
            .is_some_and(|d| d.level == DisruptionLevel::Reboot as i32)
    });
    let report = pb::CoverageReport {
        changes,
        fully_covered,
        max_disruption: Some(pb::Disruption {
            level: max_level,
            units: if max_level == DisruptionLevel::Reboot as i32 {
                Vec::new()
            } else {
                units.into_iter().collect()
            },
        }),
        reboot_required,
        facts: None,
        preservation: None,
        spec_hash,
    };
    Plan {
        report,
        steps,
        record: next,
    }
}

impl Planner<'_> {
    fn push(&mut self, c: ChangeBuilder<'_>) {
        self.changes.push(c.build());
    }

    /// Disruption of a file change: the first matching rule of the agent config, else the
    /// built-in rules (systemd units and drop-ins need a daemon-reload and a try-restart
    /// of the unit; the kubelet's override files a kubelet restart; containerd's config a
    /// containerd restart), else none. sysctl.d files are applied live separately.
    fn file_disruption(&self, path: &str) -> (pb::Disruption, String) {
        if let Some(rule) = self.config.disruption_for(path) {
            let units: Vec<&str> = rule.units.iter().map(String::as_str).collect();
            return (
                disruption(rule.action.level(), &units),
                format!(
                    "written atomically; disruption rule {:?} applies",
                    rule.path
                ),
            );
        }
        if let Some((level, unit, why)) = builtin_disruption(path, &self.config.kubelet.unit) {
            return (
                disruption(level, &[unit.as_str()]),
                format!("written atomically; {why}"),
            );
        }
        (
            disruption(DisruptionLevel::None, &[]),
            "written atomically; no disruption rule matches the path".into(),
        )
    }

    fn add_disruption_steps(&mut self, d: &pb::Disruption) {
        match DisruptionLevel::try_from(d.level).unwrap_or(DisruptionLevel::None) {
            DisruptionLevel::Reload => self.steps.reloads.extend(d.units.iter().cloned()),
            // a drain is the caller's to do first (CAPI does not drain for in-place
            // updates); the agent then restarts the rule's units
            DisruptionLevel::Restart | DisruptionLevel::Drain => {
                self.steps.restarts.extend(d.units.iter().cloned())
            }
            DisruptionLevel::DaemonReload => {
                self.steps.daemon_reload = true;
                self.steps.try_restarts.extend(d.units.iter().cloned());
            }
            DisruptionLevel::Reboot => self.steps.reboot = true,
            _ => {}
        }
    }

    fn files(&mut self) {
        let items = std::mem::take(&mut self.items);
        for it in &items {
            let f: &FileSpec = &it.file;
            if it.agent_owned && self.opts.leave_files.contains(&f.path) {
                if let Some(m) = self.record.files.get(&f.path) {
                    self.next.files.insert(f.path.clone(), m.clone());
                }
                continue;
            }
            let id = it.id.clone();
            let obs = self
                .obs
                .files
                .get(&f.path)
                .cloned()
                .unwrap_or(FileObs::Absent);
            let uid = match &f.owner {
                None => Ok(0),
                Some(o) => self.obs.accounts.uid(o),
            };
            let gid = match (&f.group, &f.owner) {
                (Some(g), _) => self.obs.accounts.gid(g),
                (None, _) => Ok(0),
            };
            let (d, reason) = it
                .disruption
                .clone()
                .unwrap_or_else(|| self.file_disruption(&f.path));
            let reserved = self
                .reserved
                .iter()
                .filter(|_| !it.agent_owned)
                .find(|(p, _)| f.path == **p || f.path.starts_with(&format!("{p}/")));
            let problem = if let Some((_, owner)) = reserved {
                Some(format!(
                    "{} is managed by {owner}; change it there instead of as a file",
                    f.path
                ))
            } else if f.path == "/boot" || f.path.starts_with("/boot/") {
                Some(format!(
                    "{} is boot configuration; inplaced changes it only through the kernelArgs section",
                    f.path
                ))
            } else if let FileObs::Conflict(c) = &obs {
                Some(c.clone())
            } else if let Err(e) = &uid {
                Some(e.clone())
            } else if let Err(e) = &gid {
                Some(e.clone())
            } else if let Some(p) = self
                .config
                .policy
                .refuses(&f.path)
                .filter(|_| !it.agent_owned)
            {
                Some(p)
            } else if f.content.len() as u64 > self.config.policy.max_file_bytes {
                Some(format!(
                    "policy: content is {} bytes, over the limit of {} (policy.max_file_bytes)",
                    f.content.len(),
                    self.config.policy.max_file_bytes
                ))
            } else {
                None
            };
            let after_summary = summary_of(
                &f.sha256,
                f.mode,
                *uid.as_ref().unwrap_or(&0),
                *gid.as_ref().unwrap_or(&0),
            );
            // the observed content is hashed once, for the summary and the commit check
            let obs_sha = match &obs {
                FileObs::File { content, .. } => Some(sha256_hex(content)),
                _ => None,
            };
            let obs_summary = match (&obs, &obs_sha) {
                (FileObs::File { entry, .. }, Some(h)) => {
                    summary_of(h, entry.mode, entry.uid, entry.gid)
                }
                _ => summary_of_obs(&obs),
            };
            let obs_fingerprint = match &obs_sha {
                Some(h) => format!("sha256:{h}"),
                None => obs.fingerprint(),
            };
            let (obs_summary, after_summary) =
                it.summary.clone().unwrap_or((obs_summary, after_summary));
            if let Some(problem) = problem {
                self.push(ChangeBuilder {
                    id,
                    op: if obs == FileObs::Absent {
                        ChangeOperation::Create
                    } else {
                        ChangeOperation::Update
                    },
                    before: obs_summary.clone(),
                    after: after_summary,
                    covered: Err(problem),
                    disruption: d,
                    targets: vec![f.path.clone()],
                });
                continue;
            }
            let (uid, gid) = (uid.unwrap_or(0), gid.unwrap_or(0));
            let sha = format!("sha256:{}", f.sha256);
            let prior = self.record.files.get(&f.path).map(|m| m.original.clone());
            let (op, original, save) = match &obs {
                FileObs::Absent => (
                    Some(ChangeOperation::Create),
                    prior.unwrap_or(Original::Absent),
                    None,
                ),
                FileObs::File { content, entry } => {
                    let same = obs_sha.as_deref() == Some(f.sha256.as_str())
                        && content.len() == f.content.len()
                        && entry.mode == f.mode
                        && entry.uid == uid
                        && entry.gid == gid;
                    match (same, prior) {
                        (true, Some(p)) => (None, p, None),
                        (true, None) => (None, Original::Unchanged, None),
                        (false, Some(p)) => (Some(ChangeOperation::Update), p, None),
                        (false, None) => (
                            Some(ChangeOperation::Update),
                            Original::Saved {
                                backup: backup_name(&f.path),
                                sha256: format!(
                                    "sha256:{}",
                                    obs_sha.clone().unwrap_or_else(|| sha256_hex(content))
                                ),
                                mode: entry.mode,
                                uid: entry.uid,
                                gid: entry.gid,
                            },
                            Some(content.clone()),
                        ),
                    }
                }
                FileObs::Conflict(_) => (None, Original::Absent, None),
            };
            // node.d mirrors the spec's drop-ins: nothing to restore, a dropped one goes
            let (original, save) = if it.agent_owned {
                (Original::Absent, None)
            } else {
                (original, save)
            };
            let created_dirs = self
                .record
                .files
                .get(&f.path)
                .map(|m| m.created_dirs.clone())
                .unwrap_or_default();
            self.next.files.insert(
                f.path.clone(),
                ManagedFile {
                    sha256: sha,
                    mode: f.mode,
                    uid,
                    gid,
                    original,
                    created_dirs,
                    item: it.item.clone(),
                },
            );
            if let Some(op) = op {
                self.add_disruption_steps(&d);
                self.steps.writes.push(Write {
                    path: f.path.clone(),
                    content: f.content.clone(),
                    mode: f.mode,
                    uid,
                    gid,
                    keep_meta: false,
                    expect: obs_fingerprint.clone(),
                    save_original: save,
                    managed_file: true,
                });
                self.push(ChangeBuilder {
                    id,
                    op,
                    before: obs_summary.clone(),
                    after: after_summary,
                    covered: Ok(&reason),
                    disruption: d,
                    targets: vec![f.path.clone()],
                });
            }
        }
        // files dropped from the spec
        let desired: BTreeSet<&str> = items.iter().map(|it| it.file.path.as_str()).collect();
        for (path, m) in &self.record.files {
            if desired.contains(path.as_str()) {
                continue;
            }
            let id = m.item.clone().unwrap_or_else(|| format!("files[{path}]"));
            let obs = self.obs.files.get(path).cloned().unwrap_or(FileObs::Absent);
            let d = match m.item.as_deref().and_then(|i| item_disruption(i, path)) {
                Some(d) => d,
                None => self.file_disruption(path).0,
            };
            let is_ntp = m.item.as_deref() == Some("ntp");
            let obs_content = match &obs {
                FileObs::File { content, .. } => Some(content.as_slice()),
                _ => None,
            };
            match &m.original {
                Original::Unchanged => {}
                Original::Absent => {
                    if matches!(obs, FileObs::File { .. }) {
                        self.add_disruption_steps(&d);
                        self.steps.removes.push(Remove {
                            path: path.clone(),
                            expect: obs.fingerprint(),
                            dirs: m.created_dirs.iter().rev().cloned().collect(),
                        });
                        self.push(ChangeBuilder {
                            id,
                            op: ChangeOperation::Delete,
                            before: match obs_content {
                                Some(c) if is_ntp => ntp_summary(path, c),
                                _ => summary_of_obs(&obs),
                            },
                            after: "absent".into(),
                            covered: Ok("created by inplaced and dropped from the spec: deleted"),
                            disruption: d,
                            targets: vec![path.clone()],
                        });
                    }
                }
                Original::Saved {
                    backup,
                    sha256,
                    mode,
                    uid,
                    gid,
                } => {
                    let Some(bytes) = self
                        .obs
                        .originals
                        .get(backup)
                        .filter(|b| format!("sha256:{}", sha256_hex(b)) == *sha256)
                    else {
                        self.push(ChangeBuilder {
                            id,
                            op: ChangeOperation::Update,
                            before: summary_of_obs(&obs),
                            after: sha256.clone(),
                            covered: Err(format!(
                                "the saved original of {path} is missing from the state directory or does not match its recorded {sha256}; restore it by hand or keep the file in the spec"
                            )),
                            disruption: d,
                            targets: vec![path.clone()],
                        });
                        continue;
                    };
                    self.add_disruption_steps(&d);
                    self.steps.writes.push(Write {
                        path: path.clone(),
                        content: bytes.clone(),
                        mode: *mode,
                        uid: *uid,
                        gid: *gid,
                        keep_meta: false,
                        expect: obs.fingerprint(),
                        save_original: None,
                        managed_file: false,
                    });
                    self.steps.drop_originals.push(backup.clone());
                    let (before, after) = match obs_content {
                        Some(c) if is_ntp => (ntp_summary(path, c), ntp_summary(path, bytes)),
                        _ => (summary_of_obs(&obs), file_summary(bytes, *mode, *uid, *gid)),
                    };
                    self.push(ChangeBuilder {
                        id,
                        op: ChangeOperation::Update,
                        before,
                        after,
                        covered: Ok("dropped from the spec: the original saved before the first overwrite is restored"),
                        disruption: d,
                        targets: vec![path.clone()],
                    });
                }
            }
        }
    }

    fn kubelet(&mut self) {
        let unit = self.config.kubelet.unit.clone();
        let restart = disruption(DisruptionLevel::Restart, &[&unit]);
        let drain = disruption(DisruptionLevel::Drain, &[&unit]);
        let mut restart_needed = false;

        // ---- flags (first: config fields check the resulting flags for shadowing)
        let flags_path = self.config.kubelet.flags_path.clone();
        let flags_obs = self.obs.kubelet.flags.clone();
        let (flags_text, flags_entry, flags_problem) = match &flags_obs {
            observe::TextObs::Text(t, e) => (t.clone(), Some(*e), None),
            observe::TextObs::Absent => (String::new(), None, None),
            observe::TextObs::Problem(p) => (String::new(), None, Some(p.clone())),
        };
        let current_flags = match &flags_problem {
            Some(p) => Err(p.clone()),
            None => kflags::parse(&flags_text, "KUBELET_KUBEADM_ARGS")
                .map(Option::unwrap_or_default)
                .map_err(|e| format!("{flags_path}: {e}")),
        };
        let mut final_flags: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut set: Vec<(String, String)> = Vec::new();
        let mut remove: Vec<String> = Vec::new();
        let unreadable = self.obs.kubelet.problems.first().map(|p| {
            format!("cannot check KUBELET_EXTRA_ARGS, which overrides kubeadm-flags.env: {p}")
        });
        match &current_flags {
            Err(e) => {
                for (name, value) in &self.desired.kubelet_flags {
                    self.push(ChangeBuilder {
                        id: format!("kubelet.flags[{name}]"),
                        op: ChangeOperation::Update,
                        before: String::new(),
                        after: value.clone(),
                        covered: Err(e.clone()),
                        disruption: restart.clone(),
                        targets: vec![flags_path.clone()],
                    });
                }
            }
            Ok(cur) => {
                for f in cur {
                    final_flags.insert(f.name.clone(), f.value.clone());
                }
                let current_of = |n: &str| {
                    cur.iter()
                        .rev()
                        .find(|f| f.name == n)
                        .map(|f| f.value.clone().unwrap_or_default())
                };
                for (name, value) in &self.desired.kubelet_flags {
                    let id = format!("kubelet.flags[{name}]");
                    let now = current_of(name);
                    let prior = match self.record.kubelet_flags.get(name) {
                        Some(m) => m.prior.clone(),
                        None => now.clone(),
                    };
                    self.next.kubelet_flags.insert(
                        name.clone(),
                        ManagedValue {
                            value: value.clone(),
                            prior,
                        },
                    );
                    final_flags.insert(name.clone(), Some(value.clone()));
                    let shadow = self.obs.kubelet.extra_args.iter().find_map(|(p, fl)| {
                        fl.iter()
                            .rev()
                            .find(|f| &f.name == name)
                            .filter(|f| f.value.as_deref() != Some(value.as_str()))
                            .map(|f| (p.clone(), f.value.clone().unwrap_or_default()))
                    });
                    if now.as_deref() == Some(value.as_str()) && shadow.is_none() {
                        continue;
                    }
                    let resets = kubelet_state_files(&[name.as_str()], true);
                    let covered = match (&shadow, &unreadable) {
                        (_, Some(p)) => Err(p.clone()),
                        (Some((p, v)), None) => Err(format!(
                            "--{name}={v} in {p} (KUBELET_EXTRA_ARGS) comes later on the kubelet command line and overrides kubeadm-flags.env; change or remove it there"
                        )),
                        (None, None) => Ok(if resets.is_empty() {
                            "kubeadm-flags.env edited, other flags kept in order; kubelet restart"
                        } else {
                            RESET_REASON
                        }),
                    };
                    if covered.is_ok() {
                        set.push((name.clone(), value.clone()));
                        restart_needed = true;
                        self.steps
                            .kubelet_state_reset
                            .extend(resets.iter().cloned());
                    }
                    self.push(ChangeBuilder {
                        id,
                        op: upsert(now.is_some()),
                        before: now.clone().unwrap_or_else(|| "absent".into()),
                        after: value.clone(),
                        covered,
                        disruption: if resets.is_empty() {
                            restart.clone()
                        } else {
                            drain.clone()
                        },
                        targets: vec![flags_path.clone()],
                    });
                }
                for (name, m) in &self.record.kubelet_flags {
                    if self.desired.kubelet_flags.contains_key(name) {
                        continue;
                    }
                    let now = current_of(name);
                    let want = m.prior.clone();
                    if now == want {
                        continue;
                    }
                    match &want {
                        Some(v) => {
                            set.push((name.clone(), v.clone()));
                            final_flags.insert(name.clone(), Some(v.clone()));
                        }
                        None => {
                            remove.push(name.clone());
                            final_flags.remove(name);
                        }
                    }
                    restart_needed = true;
                    let resets = kubelet_state_files(&[name.as_str()], true);
                    self.steps
                        .kubelet_state_reset
                        .extend(resets.iter().cloned());
                    let mut reason =
                        String::from("dropped from the spec: the prior value is restored");
                    if now.as_deref() != Some(m.value.as_str()) {
                        reason.push_str(&format!(
                            " (the node has {}, not the {} inplaced set: another writer changed it)",
                            now.clone().unwrap_or_else(|| "no value".into()),
                            m.value
                        ));
                    }
                    reason.push_str("; kubelet restart");
                    self.push(ChangeBuilder {
                        id: format!("kubelet.flags[{name}]"),
                        op: if want.is_some() {
                            ChangeOperation::Update
                        } else {
                            ChangeOperation::Delete
                        },
                        before: now.unwrap_or_else(|| "absent".into()),
                        after: want.clone().unwrap_or_else(|| "absent".into()),
                        covered: Ok(&reason),
                        disruption: if resets.is_empty() {
                            restart.clone()
                        } else {
                            drain.clone()
                        },
                        targets: vec![flags_path.clone()],
                    });
                }
            }
        }
        if !set.is_empty() || !remove.is_empty() {
            match kflags::edit(&flags_text, "KUBELET_KUBEADM_ARGS", &set, &remove) {
                Ok(text) => {
                    self.steps.writes.push(Write {
                        path: flags_path.clone(),
                        content: text.into_bytes(),
                        mode: 0o644,
                        uid: 0,
                        gid: 0,
                        keep_meta: flags_entry.is_some(),
                        expect: flags_obs.fingerprint(),
                        save_original: None,
                        managed_file: false,
                    });
                }
                Err(e) => self.fail_all("kubelet.flags[", &format!("{flags_path}: {e}")),
            }
        }

        // ---- config
        let cfg_path = self.config.kubelet.config_path.clone();
        let desired_leaves = self
            .desired
            .kubelet_config
            .as_ref()
            .map(|m| kcfg::leaves(&Value::Object(m.clone())))
            .unwrap_or_default();
        let wants = !desired_leaves.is_empty() || !self.record.kubelet_config.is_empty();
        if wants {
            let cfg_obs = self.obs.kubelet.config.clone();
            let parsed = match &cfg_obs {
                observe::TextObs::Absent => Err(format!(
                    "no KubeletConfiguration file at {cfg_path}; set kubelet.config_path in the agent config if the kubelet reads another file"
                )),
                observe::TextObs::Problem(p) => Err(p.clone()),
                observe::TextObs::Text(text, entry) => kcfg::parse(text)
                    .map(|doc| (text.clone(), *entry, doc))
                    .map_err(|e| format!("{cfg_path}: {e}")),
            };
            let mut edits = Vec::new();
            let mut edit_ids = Vec::new();
            for (path, value) in &desired_leaves {
                let id = config_id(path);
                let (text_doc, now) = match &parsed {
                    Ok((_, _, doc)) => (true, kcfg::get(doc, path).cloned()),
                    Err(_) => (false, None),
                };
                if text_doc {
                    let prior = match self.record.kubelet_config.get(&id) {
                        Some(m) => m.value.prior.clone(),
                        None => now.clone(),
                    };
                    self.next.kubelet_config.insert(
                        id.clone(),
                        ManagedField {
                            path: path.clone(),
                            value: ManagedValue {
                                value: value.clone(),
                                prior,
                            },
                        },
                    );
                }
                if text_doc && now.as_ref() == Some(value) {
                    continue;
                }
                let resets = kubelet_state_files(&[path[0].as_str()], false);
                let covered = match (&parsed, self.config_field_problem(path, &final_flags)) {
                    (Err(e), _) => Err(e.clone()),
                    (_, Some(s)) => Err(s),
                    _ => {
                        edits.push(LeafEdit::Set(path.clone(), value.clone()));
                        edit_ids.push(id.clone());
                        self.steps
                            .kubelet_state_reset
                            .extend(resets.iter().cloned());
                        Ok(if resets.is_empty() {
                            "merged into the KubeletConfiguration file, every other field kept; kubelet restart"
                        } else {
                            RESET_REASON
                        })
                    }
                };
                self.push(ChangeBuilder {
                    id,
                    op: upsert(now.is_some()),
                    before: json_summary(now.as_ref()),
                    after: json_summary(Some(value)),
                    covered,
                    disruption: if resets.is_empty() {
                        restart.clone()
                    } else {
                        drain.clone()
                    },
                    targets: vec![cfg_path.clone()],
                });
            }
            if let Ok((_, _, doc)) = &parsed {
                for (id, m) in &self.record.kubelet_config {
                    if desired_leaves.iter().any(|(p, _)| p == &m.path) {
                        continue;
                    }
                    let now = kcfg::get(doc, &m.path).cloned();
                    if now == m.value.prior {
                        continue;
                    }
                    edits.push(match &m.value.prior {
                        Some(v) => LeafEdit::Set(m.path.clone(), v.clone()),
                        None => LeafEdit::Remove(m.path.clone()),
                    });
                    edit_ids.push(id.clone());
                    let resets = kubelet_state_files(&[m.path[0].as_str()], false);
                    self.steps
                        .kubelet_state_reset
                        .extend(resets.iter().cloned());
                    self.push(ChangeBuilder {
                        id: id.clone(),
                        op: if m.value.prior.is_some() {
                            ChangeOperation::Update
                        } else {
                            ChangeOperation::Delete
                        },
                        before: json_summary(now.as_ref()),
                        after: json_summary(m.value.prior.as_ref()),
                        covered: Ok(
                            "dropped from the spec: the prior value is restored; kubelet restart",
                        ),
                        disruption: if resets.is_empty() {
                            restart.clone()
                        } else {
                            drain.clone()
                        },
                        targets: vec![cfg_path.clone()],
                    });
                }
            }
            if let (Ok((text, entry, _)), false) = (&parsed, edits.is_empty()) {
                match kcfg::edit(text, &edits) {
                    Ok(edited) if edited.faithful => {
                        restart_needed = true;
                        self.steps.writes.push(Write {
                            path: cfg_path.clone(),
                            content: edited.text.into_bytes(),
                            mode: entry.mode,
                            uid: entry.uid,
                            gid: entry.gid,
                            keep_meta: true,
                            expect: cfg_obs.fingerprint(),
                            save_original: None,
                            managed_file: false,
                        });
                    }
                    Ok(_) => {
                        let reason = format!(
                            "{cfg_path} uses YAML that can not be edited in place at this field (flow style, anchors, tags or block scalars); inplaced would have to re-render the whole file and lose its comments and layout: write the field in block style, or manage the file under files"
                        );
                        for c in self.changes.iter_mut().filter(|c| edit_ids.contains(&c.id)) {
                            c.covered = false;
                            c.reason = reason.clone();
                        }
                        self.steps.kubelet_state_reset.clear();
                    }
                    Err(e) => self.fail_all("kubelet.config", &format!("{cfg_path}: {e}")),
                }
            }
        }
        if restart_needed {
            self.steps.restarts.insert(unit);
        }
    }

    /// Why a KubeletConfiguration field can not be merged: unknown to the kubelet, or
    /// overridden by a flag (flags win over the config file).
    fn config_field_problem(
        &self,
        path: &[String],
        final_flags: &BTreeMap<String, Option<String>>,
    ) -> Option<String> {
        let top = path[0].as_str();
        if !kcfg_fields::is_known(top) {
            return Some(format!(
                "{top} is not a KubeletConfiguration (kubelet.config.k8s.io/v1beta1) field; check the spelling: the kubelet ignores or refuses unknown fields"
            ));
        }
        let flag = kcfg_fields::flag_for(path)?;
        if let Some(v) = final_flags.get(&flag) {
            return Some(format!(
                "kubelet flag --{flag}={} in {} overrides KubeletConfiguration field {}; manage it under kubelet.flags instead",
                v.clone().unwrap_or_default(),
                self.config.kubelet.flags_path,
                path.join(".")
            ));
        }
        self.obs.kubelet.extra_args.iter().find_map(|(p, fl)| {
            fl.iter().any(|f| f.name == flag).then(|| {
                format!(
                    "kubelet flag --{flag} in {p} (KUBELET_EXTRA_ARGS) overrides KubeletConfiguration field {}; change it there",
                    path.join(".")
                )
            })
        })
    }

    /// Marks every change whose id starts with `prefix` not covered with `reason`.
    fn fail_all(&mut self, prefix: &str, reason: &str) {
        for c in self.changes.iter_mut().filter(|c| c.id.starts_with(prefix)) {
            c.covered = false;
            c.reason = reason.to_string();
        }
    }

    fn kernel_args(&mut self) {
        if self.desired.kernel_args.is_empty()
            && self.record.kernel_args.is_empty()
            && self.record.kernel_args_removed.is_empty()
        {
            return;
        }
        let reboot = disruption(DisruptionLevel::Reboot, &[]);
        let desired: Vec<Arg> = self
            .desired
            .kernel_args
            .iter()
            .filter_map(|a| Arg::parse_one(a).ok())
            .collect();
        let added: Vec<Arg> = self
            .record
            .kernel_args
            .iter()
            .filter_map(|a| Arg::parse_one(a).ok())
            .collect();
        // args the agent added that are no longer desired (multiset difference)
        let mut want = desired.clone();
        let mut to_remove = Vec::new();
        let mut kept = Vec::new();
        for a in &added {
            if let Some(i) = want.iter().position(|d| d.matches_exactly(a)) {
                want.remove(i);
                kept.push(a.clone());
            } else {
                to_remove.push(a.clone());
            }
        }
        let backend = match &self.obs.kernel {
            Ok(b) => b,
            Err(e) => {
                for a in &desired {
                    self.push(ChangeBuilder {
                        id: format!("kernelArgs[{}]", a.key()),
                        op: ChangeOperation::Create,
                        before: String::new(),
                        after: a.as_str().to_string(),
                        covered: Err(e.to_string()),
                        disruption: reboot.clone(),
                        targets: vec![],
                    });
                }
                self.next.kernel_args = self.record.kernel_args.clone();
                return;
            }
        };
        let next_boot = backend.next_boot().apply(&to_remove, &[]);
        // desired args missing from the next boot (counting duplicates)
        let mut have: Vec<Arg> = next_boot.args().to_vec();
        let mut to_add = Vec::new();
        for d in &desired {
            if let Some(i) = have.iter().position(|h| h.matches_exactly(d)) {
                have.remove(i);
            } else {
                to_add.push(d.clone());
            }
        }
        let mut owned = kept;
        owned.extend(to_add.iter().cloned());
        self.next.kernel_args = owned.iter().map(|a| a.as_str().to_string()).collect();
        // Removals staged in this boot and still running (not desired again): they take
        // effect at the next boot, whatever operation comes in between.
        let boot = self.obs.boot_id.clone().unwrap_or_default();
        // the running command line, parsed once for this section
        let running = self.obs.proc_cmdline.as_ref().map(|c| Cmdline::parse(c));
        let still_running = |a: &Arg| running.as_ref().is_some_and(|r| r.contains_exact(a));
        let mut lingering: Vec<Arg> = Vec::new();
        let mut pending = Vec::new();
        for p in &self.record.kernel_args_removed {
            let Ok(a) = Arg::parse_one(&p.arg) else {
                continue;
            };
            if p.boot_id == boot
                && !boot.is_empty()
                && still_running(&a)
                && !owned.iter().any(|o| o.matches_exactly(&a))
                && !to_remove.iter().any(|r| r.matches_exactly(&a))
            {
                lingering.push(a);
                pending.push(p.clone());
            }
        }
        for a in &to_remove {
            if still_running(a) && !boot.is_empty() {
                pending.push(crate::state::PendingRemoval {
                    arg: a.as_str().to_string(),
                    boot_id: boot.clone(),
                });
            }
        }
        self.next.kernel_args_removed = pending;

        // group by key for the report; the id shows the key as first written
        let norm = |k: &str| k.replace('_', "-");
        let mut by_key: BTreeMap<String, KeyChange> = BTreeMap::new();
        for a in &to_remove {
            let e = by_key
                .entry(norm(a.key()))
                .or_insert_with(|| KeyChange::new(a.key()));
            e.removed.push(a.clone());
        }
        for a in &to_add {
            let e = by_key
                .entry(norm(a.key()))
                .or_insert_with(|| KeyChange::new(a.key()));
            e.appended.push(a.clone());
        }
        // args on the running command line that do not come from the edited configuration:
        // on GRUB they come from GRUB_CMDLINE_LINUX_DEFAULT, which follows GRUB_CMDLINE_LINUX
        let mut later: Vec<Arg> = Vec::new();
        if backend.name() == "grub"
            && let Some(run) = &running
        {
            let mut cfg: Vec<Arg> = backend.next_boot().args().to_vec();
            for a in run.without_bootloader_injected().args() {
                if matches!(a.key(), "root" | "ro" | "rw") {
                    continue;
                }
                if let Some(i) = cfg.iter().position(|c| c.matches_exactly(a)) {
                    cfg.remove(i);
                } else if !owned.iter().any(|o| o.matches_exactly(a)) {
                    later.push(a.clone());
                }
            }
        }
        let current_len = self
            .obs
            .proc_cmdline
            .as_ref()
            .map(|c| c.len())
            .unwrap_or_else(|| backend.next_boot().render().len());
        let added: usize = to_add.iter().map(|a| a.as_str().len() + 1).sum();
        let removed: usize = to_remove.iter().map(|a| a.as_str().len() + 1).sum();
        let projected = (current_len + added).saturating_sub(removed);
        let max = self.config.kernel_args.max_length;
        let problem = if self.opts.reboot_forbidden {
            Some("kernel arguments take effect only after a reboot and the reboot policy is FORBIDDEN".to_string())
        } else if projected > max && added > removed {
            Some(format!(
                "the kernel command line would be {projected} bytes ({current_len} now, {added} added, {removed} removed), over the platform limit of {max} bytes (kernel_args.max_length; the kernel truncates longer ones)"
            ))
        } else {
            backend.problem()
        };
        let edits = if problem.is_none() && !by_key.is_empty() {
            backend.edit(&to_remove, &to_add)
        } else {
            Ok(Vec::new())
        };
        let targets: Vec<String> = match &edits {
            Ok(e) => e.iter().map(|e| e.path.clone()).collect(),
            Err(_) => vec![],
        };
        let none = disruption(DisruptionLevel::None, &[]);
        let configured = backend.next_boot();
        let mut any_reboot = false;
        for kc in by_key.values() {
            // a reboot is needed only where the running kernel differs from the result
            let needs_reboot = match &running {
                None => true,
                Some(run) => {
                    kc.appended.iter().any(|a| !run.contains_exact(a))
                        || kc.removed.iter().any(|r| run.contains_exact(r))
                }
            };
            let shadow = later.iter().find(|l| {
                kc.appended.iter().any(|a| a.same_key(l))
                    && !kc.appended.iter().any(|a| a.matches_exactly(l))
            });
            let others: Vec<&Arg> = configured
                .args()
                .iter()
                .filter(|c| {
                    kc.appended.iter().any(|a| a.same_key(c))
                        && !owned.iter().any(|o| o.matches_exactly(c))
                })
                .collect();
            let mut reason = backend.reason();
            if !kc.appended.is_empty() {
                reason.push_str("; appended after the existing arguments");
                if !others.is_empty() {
                    let list: Vec<&str> = others.iter().map(|a| a.as_str()).collect();
                    reason.push_str(&format!(
                        ", after {} which inplaced leaves alone (for most parameters the last occurrence wins)",
                        list.join(" ")
                    ));
                }
            } else {
                reason.push_str("; removes exactly the arguments inplaced added");
            }
            reason.push_str(if needs_reboot {
                ", takes effect at the next boot"
            } else {
                "; the running kernel already matches, no reboot needed"
            });
            let covered = match (&problem, &edits, shadow) {
                (Some(p), _, _) => Err(p.clone()),
                (None, Err(e), _) => Err(e.clone()),
                (None, Ok(_), Some(l)) => Err(format!(
                    "{} on the running command line comes from GRUB_CMDLINE_LINUX_DEFAULT (or a grub.d file), which grub-mkconfig places after GRUB_CMDLINE_LINUX, so it would still win; change it there",
                    l.as_str()
                )),
                (None, Ok(_), None) => Ok(reason.as_str()),
            };
            if covered.is_ok() && needs_reboot {
                any_reboot = true;
            }
            let op = match (kc.removed.is_empty(), kc.appended.is_empty()) {
                (true, false) if others.is_empty() => ChangeOperation::Create,
                (false, true) => ChangeOperation::Delete,
                _ => ChangeOperation::Update,
            };
            let mut before: Vec<&str> = kc.removed.iter().map(|a| a.as_str()).collect();
            if kc.removed.is_empty() {
                before = others.iter().map(|a| a.as_str()).collect();
            }
            self.changes.push(
                ChangeBuilder {
                    id: format!("kernelArgs[{}]", kc.key),
                    op,
                    before: before.join(" "),
                    after: kc
                        .appended
                        .iter()
                        .map(|a| a.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                    covered,
                    disruption: if needs_reboot {
                        reboot.clone()
                    } else {
                        none.clone()
                    },
                    targets: targets.clone(),
                }
                .build(),
            );
        }
        let problem = problem.or_else(|| {
            self.changes
                .iter()
                .find(|c| c.id.starts_with("kernelArgs[") && !c.covered)
                .map(|c| c.reason.clone())
        });
        if problem.is_none()
            && !by_key.is_empty()
            && let Some(cmd) = backend.command_edit(&to_remove, &to_add)
        {
            self.steps.commands.push(cmd);
            self.steps.kernel_args_by_command = true;
            self.steps.reboot |= any_reboot;
        } else if let (None, Ok(edits)) = (&problem, edits)
            && !edits.is_empty()
        {
            for e in edits {
                self.steps.writes.push(Write {
                    path: e.path,
                    content: e.content,
                    mode: 0o644,
                    uid: 0,
                    gid: 0,
                    keep_meta: true,
                    expect: e.expect,
                    save_original: None,
                    managed_file: false,
                });
            }
            if let Some(cmd) = backend.regenerate() {
                self.steps.commands.push(cmd);
            }
            self.steps.reboot |= any_reboot;
        }
        // staged for the next boot but not running yet: a reboot, no edit
        if by_key.is_empty()
            && let Some(running) = &running
        {
            let mut have: Vec<Arg> = running.args().to_vec();
            let mut missing = Vec::new();
            for d in &owned {
                if let Some(i) = have.iter().position(|h| h.matches_exactly(d)) {
                    have.remove(i);
                } else {
                    missing.push(d.as_str().to_string());
                }
            }
            let gone: Vec<&str> = lingering.iter().map(|a| a.as_str()).collect();
            if (!missing.is_empty() || !gone.is_empty()) && !self.opts.reboot_forbidden {
                self.steps.reboot = true;
                // before: removed args the running kernel still has; after: staged args
                // it does not have yet (verify_after_boot reads both as arguments).
                let (before, after) = (gone.join(" "), missing.join(" "));
                self.changes.push(
                    ChangeBuilder {
                        id: "kernelArgs".into(),
                        op: ChangeOperation::Update,
                        before,
                        after,
                        covered: Ok("already staged in the boot configuration; the running kernel has not booted with it yet: reboot only"),
                        disruption: reboot.clone(),
                        targets: vec![],
                    }
                    .build(),
                );
            }
        }
    }

    /// The value systemd-sysctl would set at boot for `key`, and the file it comes from,
    /// given the sysctl.d files with `overrides` (path → new text, None = deleted) applied.
    fn boot_value(
        &self,
        key: &str,
        overrides: &BTreeMap<String, Option<String>>,
    ) -> Option<(String, String)> {
        let mut files: Vec<(String, String)> = self.obs.sysctls.files.clone();
        for (p, t) in overrides {
            files.retain(|(q, _)| q != p);
            if let Some(t) = t {
                files.push((p.clone(), t.clone()));
            }
        }
        // systemd-sysctl: by file name across the directories; /etc masks /run masks /usr
        let name = |p: &str| p.rsplit('/').next().unwrap_or_default().to_string();
        let prio = |p: &str| {
            observe::SYSCTL_DIRS
                .iter()
                .position(|d| p.starts_with(d))
                .unwrap_or(99)
        };
        files.sort_by(|a, b| {
            name(&a.0)
                .cmp(&name(&b.0))
                .then(prio(&a.0).cmp(&prio(&b.0)))
        });
        files.dedup_by(|b, a| name(&a.0) == name(&b.0));
        let want = observe::sysctl_path(key);
        let mut found = None;
        for (p, t) in &files {
            for (k, v) in parse_sysctl_conf(t) {
                if observe::sysctl_path(&k) == want {
                    found = Some((v, p.clone()));
                }
            }
        }
        found
    }

    /// sysctl.d files written or removed through the `files` section take effect live,
    /// as `systemd-sysctl` would apply them at boot (disruption none).
    fn sysctl_files_live(&mut self) {
        let drop_in = self.config.sysctl.drop_in.clone();
        let mut overrides: BTreeMap<String, Option<String>> = BTreeMap::new();
        for w in &self.steps.writes {
            if observe::is_sysctl_conf(&w.path) && w.path != drop_in {
                overrides.insert(
                    w.path.clone(),
                    Some(String::from_utf8_lossy(&w.content).into_owned()),
                );
            }
        }
        for r in &self.steps.removes {
            if observe::is_sysctl_conf(&r.path) && r.path != drop_in {
                overrides.insert(r.path.clone(), None);
            }
        }
        let mut keys = BTreeSet::new();
        for (p, t) in &overrides {
            match t {
                Some(t) => keys.extend(parse_sysctl_conf(t).into_keys()),
                None => {
                    if let Some((_, t)) = self.obs.sysctls.files.iter().find(|(q, _)| q == p) {
                        keys.extend(parse_sysctl_conf(t).into_keys());
                    }
                }
            }
        }
        let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        for key in keys {
            if self.desired.sysctls.contains_key(&key) {
                continue; // the sysctls section decides
            }
            let Some((value, from)) = self.boot_value(&key, &overrides) else {
                continue; // no file sets it any more: the live value stays, as at boot
            };
            let id = self
                .changes
                .iter()
                .position(|c| c.id == format!("files[{from}]"))
                .or_else(|| {
                    overrides.keys().find_map(|p| {
                        self.changes
                            .iter()
                            .position(|c| c.id == format!("files[{p}]"))
                    })
                });
            match self.obs.sysctls.live.get(&key).cloned().flatten() {
                None => {
                    if let Some(i) = id {
                        self.changes[i].covered = false;
                        self.changes[i].reason = format!(
                            "sets {key}, but {} does not exist on this node (unknown key, or its module is not loaded)",
                            observe::sysctl_path(&key)
                        );
                    }
                }
                Some(live) if norm(&live.value) != norm(&value) => {
                    if !live.writable {
                        if let Some(i) = id {
                            self.changes[i].covered = false;
                            self.changes[i].reason = format!("sets {key}, which is read-only");
                        }
                        continue;
                    }
                    self.steps.sysctls.push((key.clone(), value.clone()));
                    if let Some(i) = id
                        && !self.changes[i].reason.contains("applied live")
                    {
                        self.changes[i].reason.push_str(
                            "; its sysctls are applied live, as systemd-sysctl would at boot",
                        );
                    }
                }
                Some(_) => {}
            }
        }
    }

    fn sysctls(&mut self) {
        if self.desired.sysctls.is_empty() && self.record.sysctls.is_empty() {
            return;
        }
        let none = disruption(DisruptionLevel::None, &[]);
        let drop_in = self.config.sysctl.drop_in.clone();
        let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let drop_in_obs = self
            .obs
            .sysctls
            .drop_in
            .clone()
            .unwrap_or(observe::TextObs::Absent);
        let current_drop_in: BTreeMap<String, String> = drop_in_obs
            .text()
            .map(|(t, _)| parse_sysctl_conf(t))
            .unwrap_or_default();
        let mut drop_in_values = BTreeMap::new();
        for (key, value) in &self.desired.sysctls {
            let id = format!("sysctls[{key}]");
            let path = observe::sysctl_path(key);
            let live = self.obs.sysctls.live.get(key).cloned().flatten();
            let problem = match &live {
                None => Some(format!(
                    "{path} does not exist on this node: the key is unknown or its kernel module is not loaded"
                )),
                Some(l) if !l.writable => Some(format!("{path} is read-only")),
                _ => None,
            }
            .or_else(|| {
                if let observe::TextObs::Problem(p) = &drop_in_obs {
                    return Some(p.clone());
                }
                // a sysctl.d file that sorts after the drop-in would win at boot
                let mut with_ours = BTreeMap::new();
                let mut vals = BTreeMap::new();
                vals.insert(key.clone(), value.clone());
                with_ours.insert(drop_in.clone(), Some(render_sysctl_conf(&vals)));
                match self.boot_value(key, &with_ours) {
                    Some((v, from)) if from != drop_in => Some(format!(
                        "{from} sets {key} = {v} and is applied after {drop_in} at boot, so the value would not persist; remove it there"
                    )),
                    _ => None,
                }
            });
            if let Some(problem) = problem {
                self.push(ChangeBuilder {
                    id,
                    op: ChangeOperation::Update,
                    before: live.map(|l| l.value).unwrap_or_else(|| "absent".into()),
                    after: value.clone(),
                    covered: Err(problem),
                    disruption: none.clone(),
                    targets: vec![path, drop_in.clone()],
                });
                continue;
            }
            let live = live.map(|l| l.value).unwrap_or_default();
            drop_in_values.insert(key.clone(), value.clone());
            let prior = match self.record.sysctls.get(key) {
                Some(m) => m.prior.clone(),
                None => Some(live.clone()),
            };
            self.next.sysctls.insert(
                key.clone(),
                ManagedValue {
                    value: value.clone(),
                    prior,
                },
            );
            let live_ok = norm(&live) == norm(value);
            let persisted_ok = current_drop_in.get(key).map(|v| norm(v)) == Some(norm(value));
            if live_ok && persisted_ok {
                continue;
            }
            if !live_ok {
                self.steps.sysctls.push((key.clone(), value.clone()));
            }
            self.push(ChangeBuilder {
                id,
                op: ChangeOperation::Update,
                before: live.clone(),
                after: value.clone(),
                covered: Ok("written live under /proc/sys and persisted in the sysctl.d drop-in"),
                disruption: none.clone(),
                targets: vec![path, drop_in.clone()],
            });
        }
        for (key, m) in &self.record.sysctls {
            if self.desired.sysctls.contains_key(key) {
                continue;
            }
            let live = self
                .obs
                .sysctls
                .live
                .get(key)
                .cloned()
                .flatten()
                .map(|l| l.value);
            if let (Some(prior), Some(l)) = (&m.prior, &live)
                && norm(prior) != norm(l)
            {
                self.steps.sysctls.push((key.clone(), prior.clone()));
            }
            self.push(ChangeBuilder {
                id: format!("sysctls[{key}]"),
                op: ChangeOperation::Delete,
                before: live.unwrap_or_default(),
                after: m.prior.clone().unwrap_or_default(),
                covered: Ok("dropped from the spec: the prior live value is restored and the key leaves the drop-in"),
                disruption: none.clone(),
                targets: vec![observe::sysctl_path(key), drop_in.clone()],
            });
        }
        let rendered = render_sysctl_conf(&drop_in_values);
        let current_text = drop_in_obs.text().map(|(t, _)| t.to_string());
        if drop_in_values.is_empty() {
            if current_text.is_some() && !self.record.sysctls.is_empty() {
                self.steps.removes.push(Remove {
                    path: drop_in,
                    expect: drop_in_obs.fingerprint(),
                    dirs: Vec::new(),
                });
            }
        } else if current_text.as_deref() != Some(rendered.as_str()) {
            self.steps.writes.push(Write {
                path: drop_in,
                content: rendered.into_bytes(),
                mode: 0o644,
                uid: 0,
                gid: 0,
                keep_meta: false,
                expect: drop_in_obs.fingerprint(),
                save_original: None,
                managed_file: false,
            });
        }
    }
}

/// Parses sysctl.d(5) text: `key = value` lines, `#`/`;` comments, a leading `-` ignored.
pub fn parse_sysctl_conf(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with(['#', ';']) {
            continue;
        }
        if let Some((k, v)) = l.split_once('=') {
            let k = k.trim().trim_start_matches('-').to_string();
            out.insert(k, v.trim().to_string());
        }
    }
    out
}

/// Renders the agent's sysctl.d drop-in, keys sorted.
pub fn render_sysctl_conf(values: &BTreeMap<String, String>) -> String {
    let mut s =
        String::from("# Managed by inplaced: sysctls of the applied NodeSpec. Do not edit.\n");
    for (k, v) in values {
        s.push_str(&format!("{k} = {v}\n"));
    }
    s
}

/// Mode and owner a [`Write`] gives the file: the existing file's own when `keep_meta`.
pub fn resolve_keep(w: &Write, existing: Option<Entry>) -> (u32, u32, u32) {
    match existing {
        Some(e) if w.keep_meta => (e.mode, e.uid, e.gid),
        _ => (w.mode, w.uid, w.gid),
    }
}
