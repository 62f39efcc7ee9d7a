//! Kernel-argument backends: where the next boot's kernel command line is configured, and
//! how to edit it exactly.
//!
//! One trait, [`KernelArgsBackend`], one module per format. A backend is built by
//! [`detect`], which reads every file it needs from the sysroot up front; edits are then
//! pure functions returning the new bytes of each file ([`FileEdit`]), so the apply engine
//! writes them atomically and the planner stays free of I/O. Each backend's struct and
//! its probe are in their own file (`grub.rs`, `bls_entries.rs`, `ostree.rs`); this one
//! holds what they share: the sources, their in-place edit, the trait and [`detect`].
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
//!
//! A reboot-level change is first booted once as a trial ([`trial`]: the mechanism per
//! boot loader, with its documentation): [`KernelArgsBackend::trial`] stages the trial
//! entry and its one-shot, [`KernelArgsBackend::pending_trial`] finds it after the boot,
//! and the edits above are made only once the trial boot is healthy.

use crate::config::BackendChoice;
use inplace_formats::cmdline::{Arg, Cmdline};
use inplace_formats::{bls, grub_default, grubenv};
use inplace_node::sysroot::{Sysroot, SysrootError};

mod bls_entries;
mod grub;
mod ostree;
pub(crate) mod trial;

pub(crate) use bls_entries::Bls;
pub(crate) use grub::GrubDefault;
pub(crate) use ostree::Ostree;
pub(crate) use trial::{PendingTrial, TrialMeta, TrialPlan};

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

    /// How this node boots the change once, as a trial ([`trial`]), with the default
    /// left alone; the error says why it can not (no one-shot mechanism, a boot
    /// configuration that does not honour it), and the change is then made the default
    /// directly.
    fn trial(
        &self,
        _remove: &[Arg],
        _append: &[Arg],
        _meta: TrialMeta,
    ) -> Result<TrialPlan, String> {
        Err(format!(
            "the {} backend has no one-shot boot mechanism",
            self.name()
        ))
    }

    /// The trial pending on the node (its artefact exists), if any.
    fn pending_trial(&self) -> Option<PendingTrial> {
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
pub(crate) const ENTRY_DIRS: &[&str] = &[
    "/boot/loader/entries",
    "/efi/loader/entries",
    "/boot/efi/loader/entries",
];

/// Where every backend's sources lie: each [`Source::path`] a backend can return (GRUB's
/// `/etc/default/grub` and `/etc/default/grub.d/*`, BLS entries in [`ENTRY_DIRS`] or an
/// rpm-ostree `/boot/loader.N/entries`, `/boot/grub2/grubenv`, `/etc/kernel/cmdline`)
/// starts with one of these. A superset, known without reading the node: a path that
/// starts with none of them is no backend's source on any node, nor under one.
pub(crate) const SOURCE_PREFIXES: &[&str] =
    &["/etc/default/grub", "/etc/kernel/cmdline", "/boot", "/efi"];

/// Whether `path` may be one of the backend's sources, or lie under one, on some node
/// ([`SOURCE_PREFIXES`]); false means it is neither on this node, whatever
/// [`detect`] would find.
pub(crate) fn may_be_source(path: &str) -> bool {
    SOURCE_PREFIXES.iter().any(|p| path.starts_with(p))
}

/// Detects the backend from the node's boot files (or uses the configured choice): on
/// `auto`, an rpm-ostree host first, then BLS entries in each of [`ENTRY_DIRS`], then
/// `/etc/default/grub`; each backend's probe is beside its format.
pub(crate) fn detect(
    root: &Sysroot,
    choice: BackendChoice,
) -> Result<Box<dyn KernelArgsBackend>, NoBackend> {
    let b = detect_any(root, choice)?;
    debug_assert!(
        b.sources().iter().all(|s| may_be_source(&s.path)),
        "a source outside SOURCE_PREFIXES: {:?}",
        b.sources().iter().map(|s| &s.path).collect::<Vec<_>>()
    );
    Ok(b)
}

fn detect_any(
    root: &Sysroot,
    choice: BackendChoice,
) -> Result<Box<dyn KernelArgsBackend>, NoBackend> {
    if choice == BackendChoice::Auto
        && let Some(b) = Ostree::probe(root)?
    {
        return Ok(Box::new(b));
    }
    if choice != BackendChoice::Grub {
        for dir in ENTRY_DIRS {
            if let Some(b) = Bls::probe(root, dir)? {
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
    Ok(Box::new(GrubDefault::probe(root)?))
}
