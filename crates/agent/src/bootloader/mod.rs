//! Kernel-argument backends: where the next boot's kernel command line is configured, and
//! how to edit it exactly.
//!
//! One trait, [`KernelArgsBackend`], one module per format. A backend is built by
//! [`detect`], which reads every file it needs from the sysroot up front; edits are then
//! pure functions returning the new bytes of each file ([`FileEdit`]), so the apply engine
//! writes them atomically and the planner stays free of I/O.
//!
//! Backends:
//! - [`GrubDefault`]: `GRUB_CMDLINE_LINUX` in `/etc/default/grub` (Debian/Ubuntu), then the
//!   distribution's `update-grub`/`grub2-mkconfig`. Refused when a file in
//!   `/etc/default/grub.d/*.cfg`, which grub-mkconfig sources afterwards, assigns the same
//!   variable (the edit would have no effect).
//! - [`Ostree`]: rpm-ostree / bootc hosts, through `rpm-ostree kargs`.
//! - [`Bls`]: Boot Loader Specification Type #1 entries (`/boot/loader/entries/*.conf`, or
//!   on the ESP for systemd-boot): the `options` of every non-rescue entry; entries that say
//!   `options $kernelopts ...` (RHEL 8) get the value edited in `/boot/grub2/grubenv`
//!   instead. `/etc/kernel/cmdline` and `GRUB_CMDLINE_LINUX`, when present, are kept in
//!   agreement so a kernel installed later boots with the same arguments.

use crate::config::BackendChoice;
use inplace_formats::cmdline::{Arg, Cmdline};
use inplace_formats::{bls, grub_default, grubenv};
use inplace_node::sysroot::{Sysroot, SysrootError};

/// New content for one boot configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEdit {
    /// Node path.
    pub path: String,
    /// Full new content.
    pub content: Vec<u8>,
    /// `sha256:<hex>` of the content the edit was computed from.
    pub expect: String,
}

/// One configuration source of the next boot's command line.
#[derive(Debug, Clone)]
pub struct Source {
    /// Node path of the file.
    pub path: String,
    /// Kind of source, for messages ("BLS entry", "GRUB_CMDLINE_LINUX", ...).
    pub what: &'static str,
    /// Its current arguments.
    pub cmdline: Cmdline,
    bytes: Vec<u8>,
    format: SourceFormat,
}

#[derive(Debug, Clone)]
enum SourceFormat {
    GrubVar,
    BlsEntry(Box<bls::Entry>),
    Grubenv,
    KernelCmdline,
}

impl Source {
    fn edit(&self, remove: &[Arg], append: &[Arg]) -> Result<Option<FileEdit>, String> {
        let mut left = self.cmdline.clone();
        // append only what this source lacks (counting duplicates), after the removals
        let removed = left.apply(remove, &[]);
        left = removed.clone();
        let mut add = Vec::new();
        let mut have: Vec<Arg> = left.args().to_vec();
        for a in append {
            if let Some(i) = have.iter().position(|h| h.matches_exactly(a)) {
                have.remove(i);
            } else {
                add.push(a.clone());
            }
        }
        let new = removed.apply(&[], &add);
        if new == self.cmdline {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&self.bytes).into_owned();
        // every format is edited in place: only the bytes of the removed and appended
        // arguments change, so a later removal of what was appended restores the bytes
        let content = match &self.format {
            SourceFormat::GrubVar => {
                grub_default::edit_cmdline_var(&text, "GRUB_CMDLINE_LINUX", remove, &add)
                    .map_err(|e| format!("{}: {e}", self.path))?
                    .into_bytes()
            }
            SourceFormat::BlsEntry(entry) => entry
                .edit_options(remove, &add)
                .filter(|t| {
                    bls::Entry::parse(entry.file_name(), t)
                        .is_ok_and(|e| e.options_cmdline() == new)
                })
                .unwrap_or_else(|| entry.set_options(&new))
                .into_bytes(),
            SourceFormat::Grubenv => {
                let err = |e: grubenv::GrubenvError| format!("{}: {e}", self.path);
                let mut v = grubenv::VarInPlace::new(&self.bytes, "kernelopts")
                    .map_err(err)?
                    .ok_or_else(|| format!("{}: kernelopts is not set", self.path))?;
                inplace_formats::cmdline::edit_in_place(&mut v, remove, &add).map_err(err)?;
                v.bytes
            }
            SourceFormat::KernelCmdline => {
                let mut t = inplace_formats::cmdline::PlainText(text);
                let Ok(()) = inplace_formats::cmdline::edit_in_place(&mut t, remove, &add);
                t.0.into_bytes()
            }
        };
        Ok(Some(FileEdit {
            path: self.path.clone(),
            content,
            expect: format!("sha256:{}", inplace_node::digest::sha256_hex(&self.bytes)),
        }))
    }
}

/// A kernel-args backend.
pub trait KernelArgsBackend: std::fmt::Debug + Send + Sync {
    /// Short name: `grub` or `bls`.
    fn name(&self) -> &'static str;
    /// Why this backend was chosen, e.g. "bls: 2 kernel entries in /boot/loader/entries".
    fn reason(&self) -> String;
    /// Every file the backend edits, the first one being the reference for the next boot.
    fn sources(&self) -> &[Source];
    /// Why the backend can not edit this node (shadowed variable, unsupported layout).
    fn problem(&self) -> Option<String>;
    /// Command that regenerates the boot configuration after an edit, if any.
    fn regenerate(&self) -> Option<Vec<String>>;

    /// Which boot entries boot with a change of the command line, and which are left
    /// alone, for the coverage reason: every entry that will boot with it is named,
    /// including a rescue entry that reads the edited value (RHEL 8's `$kernelopts`).
    fn boot_entries(&self) -> String;

    /// The next boot's command line as configured (first source).
    fn next_boot(&self) -> Cmdline {
        self.sources()
            .first()
            .map(|s| s.cmdline.clone())
            .unwrap_or_default()
    }

    /// The next boot's command line in the order the kernel reads it: the edited source,
    /// then what the boot loader puts after it (GRUB: `GRUB_CMDLINE_LINUX`, then
    /// `GRUB_CMDLINE_LINUX_DEFAULT` for normal entries). An argument here is already where
    /// it takes effect.
    fn effective_next_boot(&self) -> Cmdline {
        self.next_boot()
    }

    /// What the kernel reads after the edited source, and where it comes from (GRUB's
    /// `GRUB_CMDLINE_LINUX_DEFAULT`); None when nothing follows it.
    fn read_after(&self) -> Option<(String, Cmdline)> {
        None
    }

    /// For backends that edit through a tool rather than files (rpm-ostree), the command
    /// that removes `remove` and appends `append`; `None` for file backends.
    fn command_edit(&self, _remove: &[Arg], _append: &[Arg]) -> Option<Vec<String>> {
        None
    }

    /// The edits that remove `remove` (one exact occurrence each) and append `append` in
    /// order, in every source; sources already in the wanted state are left alone.
    fn edit(&self, remove: &[Arg], append: &[Arg]) -> Result<Vec<FileEdit>, String> {
        let mut out = Vec::new();
        for s in self.sources() {
            if let Some(e) = s.edit(remove, append)? {
                out.push(e);
            }
        }
        Ok(out)
    }
}

/// `GRUB_CMDLINE_LINUX` in `/etc/default/grub` or, when a `/etc/default/grub.d/*.cfg`
/// reassigns it, in the last such file (where the setting takes effect).
#[derive(Debug)]
pub struct GrubDefault {
    sources: Vec<Source>,
    /// `GRUB_CMDLINE_LINUX_DEFAULT` after every fragment, and the file that sets it last.
    default: Option<(String, Cmdline)>,
    notes: Vec<String>,
    problem: Option<String>,
    regenerate: Vec<String>,
}

impl KernelArgsBackend for GrubDefault {
    fn name(&self) -> &'static str {
        "grub"
    }
    fn reason(&self) -> String {
        let mut r = format!(
            "grub: GRUB_CMDLINE_LINUX in {}, no Boot Loader Specification entries",
            self.sources[0].path
        );
        for n in &self.notes {
            r.push_str("; ");
            r.push_str(n);
        }
        r
    }
    fn sources(&self) -> &[Source] {
        &self.sources
    }
    fn problem(&self) -> Option<String> {
        self.problem.clone()
    }
    fn regenerate(&self) -> Option<Vec<String>> {
        Some(self.regenerate.clone())
    }
    fn boot_entries(&self) -> String {
        format!(
            "boots with the change: every menu entry {} generates from GRUB_CMDLINE_LINUX (each kernel's normal and recovery entries)",
            self.regenerate.join(" ")
        )
    }
    fn effective_next_boot(&self) -> Cmdline {
        match &self.default {
            Some((_, d)) => self.next_boot().apply(&[], d.args()),
            None => self.next_boot(),
        }
    }
    fn read_after(&self) -> Option<(String, Cmdline)> {
        self.default.clone()
    }
}

/// Boot Loader Specification entries, with grubenv, `/etc/kernel/cmdline` and
/// `GRUB_CMDLINE_LINUX` kept in agreement.
#[derive(Debug)]
pub struct Bls {
    entries_dir: String,
    kernel_entries: usize,
    sources: Vec<Source>,
    problem: Option<String>,
    /// The entries that boot with a change, described (file name and why).
    boot_with: Vec<String>,
    /// The entries left alone (rescue entries with their own options).
    left_alone: Vec<String>,
}

impl KernelArgsBackend for Bls {
    fn name(&self) -> &'static str {
        "bls"
    }
    fn reason(&self) -> String {
        format!(
            "bls: {} kernel entr{} in {}",
            self.kernel_entries,
            if self.kernel_entries == 1 { "y" } else { "ies" },
            self.entries_dir
        )
    }
    fn sources(&self) -> &[Source] {
        &self.sources
    }
    fn problem(&self) -> Option<String> {
        self.problem.clone()
    }
    fn regenerate(&self) -> Option<Vec<String>> {
        None
    }
    fn boot_entries(&self) -> String {
        let mut r = format!("boots with the change: {}", self.boot_with.join(", "));
        if !self.left_alone.is_empty() {
            r.push_str(&format!("; left alone: {}", self.left_alone.join(", ")));
        }
        r
    }
}

/// rpm-ostree / bootc hosts (`/run/ostree-booted`): the next boot's arguments are read
/// from the deployment's BLS entries (`/boot/loader` is a symlink to `loader.0` or
/// `loader.1`), and changed with `rpm-ostree kargs --append-if-missing=ARG
/// --delete-if-present=ARG`, which stages a new deployment; ostree's own entries are never
/// edited by hand.
#[derive(Debug)]
pub struct Ostree {
    entries_dir: String,
    sources: Vec<Source>,
}

impl KernelArgsBackend for Ostree {
    fn name(&self) -> &'static str {
        "rpm-ostree"
    }
    fn reason(&self) -> String {
        format!(
            "rpm-ostree: /run/ostree-booted exists; arguments read from {} and changed with rpm-ostree kargs",
            self.entries_dir
        )
    }
    fn sources(&self) -> &[Source] {
        &self.sources
    }
    fn problem(&self) -> Option<String> {
        None
    }
    fn regenerate(&self) -> Option<Vec<String>> {
        None
    }
    fn boot_entries(&self) -> String {
        "boots with the change: the new deployment rpm-ostree kargs stages (earlier deployments keep their arguments for rollback)".to_string()
    }
    fn command_edit(&self, remove: &[Arg], append: &[Arg]) -> Option<Vec<String>> {
        let mut cmd = vec!["rpm-ostree".to_string(), "kargs".to_string()];
        cmd.extend(
            remove
                .iter()
                .map(|a| format!("--delete-if-present={}", a.as_str())),
        );
        cmd.extend(
            append
                .iter()
                .map(|a| format!("--append-if-missing={}", a.as_str())),
        );
        Some(cmd)
    }
    fn edit(&self, _remove: &[Arg], _append: &[Arg]) -> Result<Vec<FileEdit>, String> {
        Ok(Vec::new())
    }
}

fn detect_ostree(root: &Sysroot) -> Result<Option<Ostree>, NoBackend> {
    let booted = root
        .stat("/run/ostree-booted")
        .map_err(|e| NoBackend(e.to_string()))?
        .is_some();
    if !booted {
        return Ok(None);
    }
    let dir = match root
        .read_link("/boot/loader")
        .map_err(|e| NoBackend(e.to_string()))?
    {
        Some(t) if !t.contains('/') && t.starts_with("loader") => format!("/boot/{t}/entries"),
        _ => "/boot/loader/entries".to_string(),
    };
    let Some(bls) = detect_bls(root, &dir)? else {
        return Err(NoBackend(format!(
            "/run/ostree-booted exists but {dir} has no deployment entries"
        )));
    };
    // only the deployment entries, newest first; rpm-ostree owns every file
    let sources = bls
        .sources
        .into_iter()
        .filter(|s| matches!(s.format, SourceFormat::BlsEntry(_)))
        .take(1)
        .collect();
    Ok(Some(Ostree {
        entries_dir: dir,
        sources,
    }))
}

/// Why no backend could be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoBackend(pub String);

fn read_text(root: &Sysroot, path: &str) -> Result<Option<String>, NoBackend> {
    root.read_string(path)
        .map_err(|e: SysrootError| NoBackend(e.to_string()))
}

/// Directories that may hold BLS Type #1 entries: `/boot` (GRUB with BLS), then the ESP
/// mount points systemd-boot uses (`/efi`, `/boot/efi`).
pub const ENTRY_DIRS: &[&str] = &[
    "/boot/loader/entries",
    "/efi/loader/entries",
    "/boot/efi/loader/entries",
];

/// Detects the backend from the node's boot files (or uses the configured choice).
pub fn detect(
    root: &Sysroot,
    choice: BackendChoice,
) -> Result<Box<dyn KernelArgsBackend>, NoBackend> {
    let os = root
        .read_string_following("/etc/os-release")
        .ok()
        .flatten()
        .unwrap_or_default();
    let id_like = format!(
        "{} {}",
        inplace_node::facts::os_release_value(&os, "ID").unwrap_or_default(),
        inplace_node::facts::os_release_value(&os, "ID_LIKE").unwrap_or_default()
    );
    if choice == BackendChoice::Auto
        && let Some(b) = detect_ostree(root)?
    {
        return Ok(Box::new(b));
    }
    if choice != BackendChoice::Grub {
        for dir in ENTRY_DIRS {
            if let Some(b) = detect_bls(root, dir)? {
                return Ok(Box::new(b));
            }
        }
        if choice == BackendChoice::Bls {
            return Err(NoBackend(format!(
                "kernel_args.backend is \"bls\" but no Boot Loader Specification entries were found in {}",
                ENTRY_DIRS.join(", ")
            )));
        }
    }
    let Some(text) = read_text(root, "/etc/default/grub")? else {
        return Err(NoBackend(
            "no supported boot configuration found: neither Boot Loader Specification entries nor /etc/default/grub".into(),
        ));
    };
    // grub-mkconfig sources /etc/default/grub, then /etc/default/grub.d/*.cfg in glob
    // order: the last file that assigns a variable decides its value.
    let mut fragments = vec![("/etc/default/grub".to_string(), text)];
    // a directory that can not be listed is not an empty one: a fragment in it may
    // reassign GRUB_CMDLINE_LINUX, so what grub-mkconfig would write is unknown
    let names = root.list_dir("/etc/default/grub.d").map_err(|e| {
        NoBackend(format!(
            "{e}; a /etc/default/grub.d/*.cfg file may reassign GRUB_CMDLINE_LINUX, so the next boot's kernel arguments can not be told"
        ))
    })?;
    if let Some(names) = names {
        for n in names.iter().filter(|n| n.ends_with(".cfg")) {
            let p = format!("/etc/default/grub.d/{n}");
            if let Some(t) = read_text(root, &p)? {
                fragments.push((p, t));
            }
        }
    }
    let last_assigning = |var: &str| {
        fragments
            .iter()
            .rev()
            .find(|(_, t)| grub_default::assigns(t, var))
            .map(|(p, t)| (p.clone(), t.clone()))
    };
    let (path, text) = last_assigning("GRUB_CMDLINE_LINUX").unwrap_or_else(|| fragments[0].clone());
    let mut problem = None;
    let value = match grub_default::read_var(&text, "GRUB_CMDLINE_LINUX") {
        Ok(v) => v.unwrap_or_default(),
        Err(e) => {
            problem = Some(format!(
                "{path}: {e} (GRUB_CMDLINE_LINUX takes effect from this file, sourced last by grub-mkconfig)"
            ));
            String::new()
        }
    };
    let mut notes = Vec::new();
    let default = grub_cmdline_default(&fragments, &mut problem);
    if path != "/etc/default/grub" {
        notes.push(format!(
            "{path} reassigns GRUB_CMDLINE_LINUX after /etc/default/grub, so it is edited there"
        ));
    }
    if let Some((p, _)) = last_assigning("GRUB_CMDLINE_LINUX_DEFAULT")
        && p != "/etc/default/grub"
    {
        notes.push(format!(
            "GRUB_CMDLINE_LINUX_DEFAULT of /etc/default/grub is overridden by {p}; managed arguments go to GRUB_CMDLINE_LINUX in {path}, which takes effect (normal and recovery entries)"
        ));
    }
    let rpm = [
        "fedora",
        "rhel",
        "centos",
        "rocky",
        "almalinux",
        "suse",
        "ol",
    ]
    .iter()
    .any(|d| id_like.split_whitespace().any(|w| w == *d));
    let regenerate = if rpm {
        vec![
            "grub2-mkconfig".into(),
            "-o".into(),
            "/boot/grub2/grub.cfg".into(),
        ]
    } else {
        vec!["update-grub".into()]
    };
    Ok(Box::new(GrubDefault {
        sources: vec![Source {
            path,
            what: "GRUB_CMDLINE_LINUX",
            cmdline: Cmdline::parse(&value),
            bytes: text.into_bytes(),
            format: SourceFormat::GrubVar,
        }],
        default,
        notes,
        problem,
        regenerate,
    }))
}

/// `GRUB_CMDLINE_LINUX_DEFAULT` after every fragment (what normal entries read after
/// `GRUB_CMDLINE_LINUX`), described with the file that sets it last; a value that can
/// not be evaluated is a note of the backend's reason and None.
fn grub_cmdline_default(
    fragments: &[(String, String)],
    problem: &mut Option<String>,
) -> Option<(String, Cmdline)> {
    const VAR: &str = "GRUB_CMDLINE_LINUX_DEFAULT";
    match grub_default::value_after(fragments, VAR) {
        Ok(Some(v)) => {
            let from = fragments
                .iter()
                .rev()
                .find(|(_, t)| grub_default::assigns(t, VAR))
                .map(|(p, _)| p.as_str())
                .unwrap_or_default();
            Some((format!("{VAR} (set last by {from})"), Cmdline::parse(&v)))
        }
        Ok(None) => None,
        // unknown is not empty: what follows GRUB_CMDLINE_LINUX on the kernel command
        // line may override any argument the agent adds
        Err(e) => {
            problem.get_or_insert(format!(
                "{VAR} can not be evaluated ({e}); grub-mkconfig places it after GRUB_CMDLINE_LINUX on the normal entries' kernel command line, where it may override any argument added, so what the next boot gets can not be told; write it as a plain assignment"
            ));
            None
        }
    }
}

fn detect_bls(root: &Sysroot, dir: &str) -> Result<Option<Bls>, NoBackend> {
    let Some(names) = root.list_dir(dir).map_err(|e| NoBackend(e.to_string()))? else {
        return Ok(None);
    };
    let mut entries = Vec::new();
    let mut rescue = Vec::new();
    for n in names.iter().filter(|n| n.ends_with(".conf")) {
        let path = format!("{dir}/{n}");
        let Some(text) = read_text(root, &path)? else {
            continue;
        };
        // unknown is not empty: an empty entry names no kernel and no options
        if text.trim().is_empty() {
            return Err(NoBackend(format!(
                "{path} could not be read: it is empty, which a boot entry can not be (it names no kernel); remove it or restore it"
            )));
        }
        let entry = bls::Entry::parse(n, &text).map_err(|e| NoBackend(format!("{path}: {e}")))?;
        if entry.is_rescue() {
            rescue.push(entry);
            continue;
        }
        entries.push((path, text, entry));
    }
    if entries.is_empty() {
        return Ok(None);
    }
    // newest kernel first: the reference for "next boot"
    entries.reverse();
    let mut sources = Vec::new();
    let mut problem = None;
    let mut grubenv_needed = false;
    let mut boot_with = Vec::new();
    let through_grubenv = "through $kernelopts in /boot/grub2/grubenv";
    for (path, text, entry) in &entries {
        let vars = entry.uses_variables();
        if vars.iter().any(|v| v == "kernelopts") {
            grubenv_needed = true;
            boot_with.push(format!("{} ({through_grubenv})", entry.file_name()));
            continue;
        }
        boot_with.push(format!("{} (its options line)", entry.file_name()));
        sources.push(Source {
            path: path.clone(),
            what: "BLS entry options",
            cmdline: Cmdline::parse(&entry.options().unwrap_or_default()),
            bytes: text.clone().into_bytes(),
            format: SourceFormat::BlsEntry(Box::new(entry.clone())),
        });
    }
    if grubenv_needed {
        let p = "/boot/grub2/grubenv";
        match root.read(p).map_err(|e| NoBackend(e.to_string()))? {
            Some(bytes) => match grubenv::get(&bytes, "kernelopts") {
                Ok(Some(v)) => sources.insert(
                    0,
                    Source {
                        path: p.into(),
                        what: "kernelopts in grubenv",
                        cmdline: Cmdline::parse(&v),
                        bytes,
                        format: SourceFormat::Grubenv,
                    },
                ),
                Ok(None) => {
                    problem = Some(format!(
                        "BLS entries use $kernelopts but {p} does not set kernelopts (grub.cfg's fallback value is not edited); run grub2-mkconfig first"
                    ))
                }
                Err(e) => problem = Some(format!("{p}: {e}")),
            },
            None => {
                problem = Some(format!(
                    "BLS entries use $kernelopts but {p} does not exist"
                ))
            }
        }
    }
    if let Some(text) = read_text(root, "/etc/kernel/cmdline")? {
        sources.push(Source {
            path: "/etc/kernel/cmdline".into(),
            what: "/etc/kernel/cmdline",
            cmdline: Cmdline::parse(text.trim_end_matches('\n')),
            bytes: text.into_bytes(),
            format: SourceFormat::KernelCmdline,
        });
    }
    if let Some(text) = read_text(root, "/etc/default/grub")?
        && let Ok(Some(v)) = grub_default::read_var(&text, "GRUB_CMDLINE_LINUX")
    {
        sources.push(Source {
            path: "/etc/default/grub".into(),
            what: "GRUB_CMDLINE_LINUX",
            cmdline: Cmdline::parse(&v),
            bytes: text.into_bytes(),
            format: SourceFormat::GrubVar,
        });
    }
    // a rescue entry is never edited, but one that reads $kernelopts boots with the
    // change all the same (grubby's layout on RHEL 8)
    let mut left_alone = Vec::new();
    for e in &rescue {
        if grubenv_needed && e.uses_variables().iter().any(|v| v == "kernelopts") {
            boot_with.push(format!(
                "{} (rescue entry, {through_grubenv})",
                e.file_name()
            ));
        } else {
            left_alone.push(format!("{} (rescue entry, its own options)", e.file_name()));
        }
    }
    Ok(Some(Bls {
        entries_dir: dir.to_string(),
        kernel_entries: entries.len(),
        sources,
        problem,
        boot_with,
        left_alone,
    }))
}
