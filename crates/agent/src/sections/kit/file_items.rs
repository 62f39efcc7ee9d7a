//! The file machinery: whole files written atomically with an ownership record, shared
//! by every section that writes whole files (`files`, `ntp`, `dropins`).
//!
//! Ownership rules (DESIGN §2): a file dropped from the spec is reverted to what was
//! there before the agent changed it (a created file is deleted, an overwritten one
//! restored from its saved original); nothing the agent did not write is touched. A
//! commit never overwrites a change made after the plan ([`Write::expect`]).

use std::borrow::Cow;
use std::collections::BTreeSet;

use crate::config::Config;
use crate::sections::kit::change::{ChangeBuilder, disruption};
use crate::sections::kit::observe::{FileObs, NodeView, ObserveError, observe_file};
use crate::sections::kit::steps::{Remove, Write};
use crate::sections::kit::{DriftView, Input, Output};
use crate::sections::model::Observed;
use crate::state::{ManagedFile, Original, backup_name};
use inplace_node::accounts::IdRef;
use inplace_node::accounts::{Accounts, Groups, Users};
use inplace_node::digest::sha256_hex;
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

/// A validated file item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// Absolute normalized node path.
    pub path: String,
    /// Full content.
    pub content: Vec<u8>,
    /// Permission bits (0o7777 mask).
    pub mode: u32,
    /// Owner user (None = root).
    pub owner: Option<IdRef>,
    /// Owner group (None = root).
    pub group: Option<IdRef>,
    /// Lower-case hex SHA-256 of `content`, computed once at validation.
    pub sha256: String,
}

/// A file a section writes through the machinery.
#[derive(Debug)]
pub struct FileItem<'a> {
    /// The file (path, content, mode, owner).
    pub file: Cow<'a, FileSpec>,
    /// Change id.
    pub id: String,
    /// Marker kept in the record ([`ManagedFile::item`]); None for `files`.
    pub item: Option<String>,
    /// Disruption and reason instead of the path rules.
    pub disruption: Option<(pb::Disruption, String)>,
    /// Before and after summaries instead of the content hashes (server lists for ntp).
    pub summary: Option<(String, String)>,
    /// The agent's own area (node.d): reserved paths and the write policy do not apply,
    /// no original is saved, and dropping the item deletes the file.
    pub agent_owned: bool,
}

/// What a section hands the machinery: its file items, and changes it refused before
/// any file was known (no time daemon found).
#[derive(Debug, Default)]
pub struct FileItems<'a> {
    /// Files to write, in order.
    pub items: Vec<FileItem<'a>>,
    /// Changes not covered.
    pub refused: Vec<pb::Change>,
}

/// How a section's recorded file is reverted when it left the spec.
#[derive(Debug, Clone, Default)]
pub struct DroppedFile {
    /// Disruption of the revert; None: the path rules ([`file_disruption`]).
    pub disruption: Option<pb::Disruption>,
    /// Summary of a content (node path, bytes) for before and after; None: the hashes.
    pub summary: Option<fn(&str, &[u8]) -> String>,
}

/// Observes what the machinery needs whatever the sections: the node's accounts, and
/// every file of the record with its saved original (a file that left the spec is
/// reverted from it).
pub(crate) fn observe(node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
    let root = node.root;
    // each database parsed once per file version, kept in the sysroot's memo (a plan and
    // its verifying re-plan parsed both every time: 8.5 % of an apply's instructions)
    fn users(_: &str, t: Option<String>) -> Users {
        Users::parse(&t.unwrap_or_default())
    }
    fn groups(_: &str, t: Option<String>) -> Groups {
        Groups::parse(&t.unwrap_or_default())
    }
    obs.accounts = Accounts::from_parts(
        root.read_following_memo("/etc/passwd", users)?,
        root.read_following_memo("/etc/group", groups)?,
    );
    for (path, m) in &node.record.files {
        observe_into(node, obs, path)?;
        if let Original::Saved { backup, .. } = &m.original
            && let Some(b) = node.state.read_original(backup)?
        {
            obs.originals.insert(backup.clone(), b);
        }
    }
    Ok(())
}

/// Observes `path` into `obs.files` unless it is there already.
pub(crate) fn observe_into(
    node: &NodeView<'_>,
    obs: &mut Observed,
    path: &str,
) -> Result<(), ObserveError> {
    if !obs.files.contains_key(path) {
        obs.files
            .insert(path.to_string(), observe_file(node.root, path)?);
    }
    Ok(())
}

/// `sha256:<hex> mode=<octal> uid=<n> gid=<n>`, the summary of a file.
pub(crate) fn summary_of(sha_hex: &str, mode: u32, uid: u32, gid: u32) -> String {
    format!("sha256:{sha_hex} mode={mode:04o} uid={uid} gid={gid}")
}

fn file_summary(content: &[u8], mode: u32, uid: u32, gid: u32) -> String {
    summary_of(&sha256_hex(content), mode, uid, gid)
}

fn summary_of_obs(obs: &FileObs) -> String {
    match obs {
        FileObs::File { content, entry } => file_summary(content, entry.mode, entry.uid, entry.gid),
        FileObs::Absent => "absent".into(),
        FileObs::Conflict(c) => c.clone(),
    }
}

/// Built-in disruption of a file, mirroring what systemd and the services need to read a
/// changed file: unit files and drop-ins under `/etc/systemd/system` need
/// `systemctl daemon-reload` and a try-restart of the unit; `/etc/default/kubelet` and
/// `/etc/sysconfig/kubelet` (read by the kubeadm drop-in) a kubelet restart; files under
/// `/etc/containerd` a containerd restart. Returns (level, unit, reason).
pub(crate) fn builtin_disruption(
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

/// Disruption of a file change: the first matching rule of the agent config, else the
/// built-in rules ([`builtin_disruption`]), else none. sysctl.d files are applied live
/// separately (the `sysctls` section).
pub(crate) fn file_disruption(config: &Config, path: &str) -> (pb::Disruption, String) {
    if let Some(rule) = config.disruption_for(path) {
        let units: Vec<&str> = rule.units.iter().map(String::as_str).collect();
        return (
            disruption(rule.action.level(), &units),
            format!(
                "written atomically; disruption rule {:?} applies",
                rule.path
            ),
        );
    }
    if let Some((level, unit, why)) = builtin_disruption(path, &config.kubelet.unit) {
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

/// Plans every file item (in order), then the revert of every recorded file no item
/// names any more; `dropped` says how a recorded file's section reverts it.
pub(crate) fn plan_files(
    items: &[FileItem<'_>],
    input: &Input<'_>,
    out: &mut Output,
    dropped: &dyn Fn(Option<&str>, &str) -> Option<DroppedFile>,
) {
    for it in items {
        plan_item(it, input, out);
    }
    let desired: BTreeSet<&str> = items.iter().map(|it| it.file.path.as_str()).collect();
    for (path, m) in &input.record.files {
        if !desired.contains(path.as_str()) {
            plan_dropped(path, m, input, out, dropped(m.item.as_deref(), path));
        }
    }
}

/// Why the item can not be written (checked in this order), if it can not.
fn item_problem(
    it: &FileItem<'_>,
    input: &Input<'_>,
    obs: &FileObs,
    owner: (&Result<u32, String>, &Result<u32, String>),
) -> Option<String> {
    let f: &FileSpec = &it.file;
    let policy = &input.config.policy;
    let reserved = input
        .reserved
        .iter()
        .filter(|_| !it.agent_owned)
        .find(|(p, _)| f.path == **p || f.path.starts_with(&format!("{p}/")));
    if let Some((_, owner)) = reserved {
        Some(format!(
            "{} is managed by {owner}; change it there instead of as a file",
            f.path
        ))
    } else if f.path == "/boot" || f.path.starts_with("/boot/") {
        Some(format!(
            "{} is boot configuration; inplaced changes it only through the kernelArgs section",
            f.path
        ))
    } else if let FileObs::Conflict(c) = obs {
        Some(c.clone())
    } else if let Err(e) = owner.0 {
        Some(e.clone())
    } else if let Err(e) = owner.1 {
        Some(e.clone())
    } else if let Some(p) = policy.refuses(&f.path).filter(|_| !it.agent_owned) {
        Some(p)
    } else if f.content.len() as u64 > policy.max_file_bytes {
        Some(format!(
            "policy: content is {} bytes, over the limit of {} (policy.max_file_bytes)",
            f.content.len(),
            policy.max_file_bytes
        ))
    } else {
        None
    }
}

/// The operation on a file, the original to record and the content to save before the
/// first overwrite: nothing to do when the node already has it, a create, or an update
/// that saves the original unless the record already holds one (`prior`).
fn ownership(
    f: &FileSpec,
    obs: &FileObs,
    obs_sha: Option<&str>,
    (uid, gid): (u32, u32),
    prior: Option<Original>,
) -> (Option<ChangeOperation>, Original, Option<Vec<u8>>) {
    match obs {
        FileObs::Absent => (
            Some(ChangeOperation::Create),
            prior.unwrap_or(Original::Absent),
            None,
        ),
        FileObs::File { content, entry } => {
            let same = obs_sha == Some(f.sha256.as_str())
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
                            obs_sha
                                .map(str::to_string)
                                .unwrap_or_else(|| sha256_hex(content))
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
    }
}

/// A file as the plan saw it: the observation, and its content hashed once (for the
/// summary and the commit check).
struct Seen {
    obs: FileObs,
    sha: Option<String>,
}

impl Seen {
    fn of(input: &Input<'_>, path: &str) -> Self {
        let obs = input.obs.file(path);
        let sha = match &obs {
            FileObs::File { content, .. } => Some(sha256_hex(content)),
            _ => None,
        };
        Seen { obs, sha }
    }

    fn summary(&self) -> String {
        match (&self.obs, &self.sha) {
            (FileObs::File { entry, .. }, Some(h)) => {
                summary_of(h, entry.mode, entry.uid, entry.gid)
            }
            _ => summary_of_obs(&self.obs),
        }
    }

    /// What the file must still be at commit time.
    fn fingerprint(&self) -> String {
        match &self.sha {
            Some(h) => format!("sha256:{h}"),
            None => self.obs.fingerprint(),
        }
    }
}

/// Plans one file item: refused with its problem, nothing (the node has it), or a write
/// with its ownership record.
fn plan_item(it: &FileItem<'_>, input: &Input<'_>, out: &mut Output) {
    let f: &FileSpec = &it.file;
    if it.agent_owned && input.opts.leave_files.contains(&f.path) {
        if let Some(m) = input.record.files.get(&f.path) {
            out.next.files.insert(f.path.clone(), m.clone());
        }
        return;
    }
    let seen = Seen::of(input, &f.path);
    let uid = match &f.owner {
        None => Ok(0),
        Some(o) => input.obs.accounts.uid(o),
    };
    let gid = match &f.group {
        Some(g) => input.obs.accounts.gid(g),
        None => Ok(0),
    };
    let (d, reason) = it
        .disruption
        .clone()
        .unwrap_or_else(|| file_disruption(input.config, &f.path));
    let problem = item_problem(it, input, &seen.obs, (&uid, &gid));
    let after_summary = summary_of(
        &f.sha256,
        f.mode,
        *uid.as_ref().unwrap_or(&0),
        *gid.as_ref().unwrap_or(&0),
    );
    let (before, after) = it
        .summary
        .clone()
        .unwrap_or((seen.summary(), after_summary));
    let change = |op, covered| ChangeBuilder {
        id: it.id.clone(),
        op,
        before: before.clone(),
        after: after.clone(),
        covered,
        disruption: d.clone(),
        targets: vec![f.path.clone()],
    };
    if let Some(problem) = problem {
        let op = if seen.obs == FileObs::Absent {
            ChangeOperation::Create
        } else {
            ChangeOperation::Update
        };
        out.push(change(op, Err(problem)));
        return;
    }
    let owner = (uid.unwrap_or(0), gid.unwrap_or(0));
    let (op, save) = record_item(it, input, out, &seen, owner);
    if let Some(op) = op {
        out.steps.add_disruption(&d);
        out.steps.writes.push(Write {
            path: f.path.clone(),
            content: f.content.clone(),
            mode: f.mode,
            uid: owner.0,
            gid: owner.1,
            keep_meta: false,
            expect: seen.fingerprint(),
            save_original: save,
            managed_file: true,
        });
        out.push(change(op, Ok(&reason)));
    }
}

/// Records the item in the next applied record (with the original to restore when it
/// is dropped). Returns the operation (None when the node already has the file) and
/// the content to save as the original before the first overwrite.
fn record_item(
    it: &FileItem<'_>,
    input: &Input<'_>,
    out: &mut Output,
    seen: &Seen,
    (uid, gid): (u32, u32),
) -> (Option<ChangeOperation>, Option<Vec<u8>>) {
    let f: &FileSpec = &it.file;
    let recorded = input.record.files.get(&f.path);
    let (op, original, save) = ownership(
        f,
        &seen.obs,
        seen.sha.as_deref(),
        (uid, gid),
        recorded.map(|m| m.original.clone()),
    );
    // node.d mirrors the spec's drop-ins: nothing to restore, a dropped one goes
    let (original, save) = if it.agent_owned {
        (Original::Absent, None)
    } else {
        (original, save)
    };
    out.next.files.insert(
        f.path.clone(),
        ManagedFile {
            sha256: format!("sha256:{}", f.sha256),
            mode: f.mode,
            uid,
            gid,
            original,
            created_dirs: recorded.map(|m| m.created_dirs.clone()).unwrap_or_default(),
            item: it.item.clone(),
        },
    );
    (op, save)
}

/// Plans the revert of a recorded file that left the spec: a file the agent created is
/// deleted, an overwritten one restored from its saved original.
fn plan_dropped(
    path: &str,
    m: &ManagedFile,
    input: &Input<'_>,
    out: &mut Output,
    rule: Option<DroppedFile>,
) {
    let rule = rule.unwrap_or_default();
    let obs = input.obs.file(path);
    let d = match &rule.disruption {
        Some(d) => d.clone(),
        None => file_disruption(input.config, path).0,
    };
    let revert = Revert {
        path,
        id: m
            .item
            .clone()
            .unwrap_or_else(|| ChangeId::File(path.to_string()).to_string()),
        obs: &obs,
        d,
        summary: rule.summary,
    };
    match (&m.original, &obs) {
        (Original::Unchanged, _) => {}
        (_, FileObs::Conflict(c)) => revert.left_alone(c, out),
        (Original::Absent, FileObs::File { .. }) => revert.delete(m, out),
        (Original::Absent, _) => {}
        (Original::Saved { .. }, _) => revert.restore(&m.original, input, out),
    }
}

/// The revert of one recorded file.
struct Revert<'a> {
    path: &'a str,
    id: String,
    obs: &'a FileObs,
    d: pb::Disruption,
    summary: Option<fn(&str, &[u8]) -> String>,
}

impl Revert<'_> {
    fn change(
        &self,
        op: ChangeOperation,
        (before, after): (String, String),
        covered: Result<&str, String>,
    ) -> pb::Change {
        ChangeBuilder {
            id: self.id.clone(),
            op,
            before,
            after,
            covered,
            disruption: self.d.clone(),
            targets: vec![self.path.to_string()],
        }
        .build()
    }

    /// The section's summaries of the observed content and of `other`, if it has them.
    fn summarize(&self, other: &[u8]) -> Option<(String, String)> {
        match (self.obs, self.summary) {
            (FileObs::File { content, .. }, Some(summary)) => {
                Some((summary(self.path, content), summary(self.path, other)))
            }
            _ => None,
        }
    }

    /// A recorded file that is no longer a regular file (a symlink, a directory): it is
    /// neither deleted nor restored, only no longer managed, and the change says so.
    fn left_alone(&self, conflict: &str, out: &mut Output) {
        let why = format!(
            "dropped from the spec, but {conflict}: left alone (not deleted, not restored) and no longer managed"
        );
        out.changes.push(
            ChangeBuilder {
                id: self.id.clone(),
                op: ChangeOperation::Delete,
                before: conflict.to_string(),
                after: "left alone, no longer managed".into(),
                covered: Ok(why.as_str()),
                disruption: crate::sections::kit::change::disruption(
                    pb::DisruptionLevel::None,
                    &[],
                ),
                targets: vec![self.path.to_string()],
            }
            .build(),
        );
    }

    /// Deletes a file the agent created, and the directories it created for it.
    fn delete(&self, m: &ManagedFile, out: &mut Output) {
        out.steps.add_disruption(&self.d);
        out.steps.removes.push(Remove {
            path: self.path.to_string(),
            expect: self.obs.fingerprint(),
            dirs: m.created_dirs.iter().rev().cloned().collect(),
        });
        let before = match self.summarize(&[]) {
            Some((before, _)) => before,
            None => summary_of_obs(self.obs),
        };
        out.changes.push(self.change(
            ChangeOperation::Delete,
            (before, "absent".into()),
            Ok("created by inplaced and dropped from the spec: deleted"),
        ));
    }

    /// Restores the original saved before the first overwrite; not covered when it is
    /// missing or no longer matches its recorded hash.
    fn restore(&self, original: &Original, input: &Input<'_>, out: &mut Output) {
        let Original::Saved {
            backup,
            sha256,
            mode,
            uid,
            gid,
        } = original
        else {
            return;
        };
        let path = self.path;
        let Some(bytes) = input
            .obs
            .originals
            .get(backup)
            .filter(|b| format!("sha256:{}", sha256_hex(b)) == *sha256)
        else {
            out.changes.push(self.change(
                ChangeOperation::Update,
                (summary_of_obs(self.obs), sha256.clone()),
                Err(format!(
                    "the saved original of {path} is missing from the state directory or does not match its recorded {sha256}; restore it by hand or keep the file in the spec"
                )),
            ));
            return;
        };
        out.steps.add_disruption(&self.d);
        out.steps.writes.push(Write {
            path: path.to_string(),
            content: bytes.clone(),
            mode: *mode,
            uid: *uid,
            gid: *gid,
            keep_meta: false,
            expect: self.obs.fingerprint(),
            save_original: None,
            managed_file: false,
        });
        out.steps.drop_originals.push(backup.clone());
        let summaries = self.summarize(bytes).unwrap_or_else(|| {
            (
                summary_of_obs(self.obs),
                file_summary(bytes, *mode, *uid, *gid),
            )
        });
        out.changes.push(self.change(
            ChangeOperation::Update,
            summaries,
            Ok("dropped from the spec: the original saved before the first overwrite is restored"),
        ));
    }
}

/// Drift of the recorded files whose marker `owns` accepts: content, mode or owner no
/// longer what the agent wrote.
pub(crate) fn drift(view: &DriftView<'_>, owns: impl Fn(Option<&str>) -> bool) -> Vec<pb::Drift> {
    let mut out = Vec::new();
    for (path, m) in &view.record.files {
        if !owns(m.item.as_deref()) {
            continue;
        }
        let want = summary_of(
            m.sha256.strip_prefix("sha256:").unwrap_or(&m.sha256),
            m.mode,
            m.uid,
            m.gid,
        );
        let seen = match observe_file(view.root, path) {
            Ok(obs @ FileObs::File { .. }) => summary_of_obs(&obs),
            Ok(FileObs::Absent) => "absent".into(),
            Ok(FileObs::Conflict(c)) => c,
            Err(e) => e.to_string(),
        };
        if want != seen {
            out.push(pb::Drift {
                since: None,
                id: m
                    .item
                    .clone()
                    .unwrap_or_else(|| ChangeId::File(path.to_string()).to_string()),
                expected: want,
                observed: seen,
            });
        }
    }
    out
}

/// The recorded files whose marker `owns` accepts (watched for drift).
pub(crate) fn watched(view: &DriftView<'_>, owns: impl Fn(Option<&str>) -> bool) -> Vec<String> {
    view.record
        .files
        .iter()
        .filter(|(_, m)| owns(m.item.as_deref()))
        .map(|(p, _)| p.clone())
        .collect()
}
