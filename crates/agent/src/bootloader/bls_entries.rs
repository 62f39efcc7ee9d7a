//! The `bls` backend: Boot Loader Specification Type #1 entries, with grubenv's
//! `kernelopts`, `/etc/kernel/cmdline` and `GRUB_CMDLINE_LINUX` kept in agreement. Trial
//! boots: a trial entry `inplaced-trial.conf` beside the others, booted once with
//! `grub2-reboot` (GRUB's blscfg) or `bootctl set-oneshot` (systemd-boot), see
//! [`super::trial`].

use super::trial::{self, PendingTrial, TrialMeta, TrialPlan, TrialWrite};
use super::{KernelArgsBackend, NoBackend, Source, SourceFormat, read_text};
use inplace_formats::cmdline::{Arg, Cmdline};
use inplace_formats::{bls, grub_default, grubenv};
use inplace_node::sysroot::Sysroot;

/// A non-rescue entry: its node path, text and parse.
type KernelEntry = (String, String, bls::Entry);

/// The rescue entries (never edited).
type Rescue = Vec<bls::Entry>;

/// How an entry that reads `$kernelopts` boots with a change.
const THROUGH_GRUBENV: &str = "through $kernelopts in /boot/grub2/grubenv";

/// Boot Loader Specification entries, with grubenv, `/etc/kernel/cmdline` and
/// `GRUB_CMDLINE_LINUX` kept in agreement.
#[derive(Debug)]
pub(crate) struct Bls {
    entries_dir: String,
    kernel_entries: usize,
    pub(super) sources: Vec<Source>,
    problem: Option<String>,
    /// The entries that boot with a change, described (file name and why).
    boot_with: Vec<String>,
    /// The entries left alone (rescue entries with their own options).
    left_alone: Vec<String>,
    /// What a trial boot needs.
    trial: TrialBase,
}

/// The boot loader that reads the entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loader {
    /// GRUB's blscfg (`/boot/grub2/grub.cfg` exists).
    Grub,
    /// systemd-boot (entries on the ESP, or no GRUB configuration).
    SystemdBoot,
}

/// What the trial of a change needs from the node.
#[derive(Debug, Clone)]
struct TrialBase {
    loader: Loader,
    /// The newest kernel entry's text and options line (`$kernelopts` expanded).
    newest: Option<(String, Cmdline)>,
    /// The trial entry on the node, if one is.
    entry: Option<String>,
    /// Whether the one-shot is still set (None: not known).
    one_shot: Option<bool>,
}

/// systemd-boot's one-shot entry, an EFI variable of the Boot Loader Interface's vendor
/// GUID (<https://systemd.io/BOOT_LOADER_INTERFACE/>).
const ONE_SHOT_EFIVAR: &str =
    "/sys/firmware/efi/efivars/LoaderEntryOneShot-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

impl Bls {
    fn trial_path(&self) -> String {
        format!("{}/{}.conf", self.entries_dir, trial::TRIAL_ID)
    }

    /// The command that sets the one-shot, and the one that clears it.
    fn one_shot(&self) -> (Vec<String>, Vec<String>) {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let conf = format!("{}.conf", trial::TRIAL_ID);
        match self.trial.loader {
            Loader::Grub => (
                v(&["grub2-reboot", trial::TRIAL_ID]),
                v(&[
                    "grub2-editenv",
                    "/boot/grub2/grubenv",
                    "unset",
                    "next_entry",
                ]),
            ),
            Loader::SystemdBoot => (
                v(&["bootctl", "set-oneshot", &conf]),
                v(&["bootctl", "set-oneshot", ""]),
            ),
        }
    }
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
    fn trial(
        &self,
        remove: &[Arg],
        append: &[Arg],
        mut meta: TrialMeta,
    ) -> Result<TrialPlan, String> {
        let Some((text, options)) = &self.trial.newest else {
            return Err("no kernel entry to copy for the trial entry".into());
        };
        let safe = trial::with_safety(&trial::changed(options, remove, append));
        meta.cmdline = safe.render();
        let path = self.trial_path();
        let expect = match &self.trial.entry {
            Some(t) => format!("sha256:{}", inplace_node::digest::sha256_hex(t.as_bytes())),
            None => "absent".into(),
        };
        let (set, clear) = self.one_shot();
        let how = match self.trial.loader {
            Loader::Grub => format!(
                "the trial entry {path} (a copy of the newest kernel's entry with its own options line, sorting last), `{}` boots it once through grubenv's next_entry",
                set.join(" ")
            ),
            Loader::SystemdBoot => format!(
                "the trial entry {path} (a copy of the newest kernel's entry, sorting last), `bootctl set-oneshot` boots it once through the LoaderEntryOneShot EFI variable, which systemd-boot removes as it reads it"
            ),
        };
        Ok(TrialPlan {
            writes: vec![TrialWrite {
                path,
                content: trial::bls_entry(&meta, text, &safe).into_bytes(),
                mode: 0o644,
                expect,
            }],
            commands: vec![set],
            clear_one_shot: clear,
            how,
        })
    }
    fn pending_trial(&self) -> Option<PendingTrial> {
        let text = self.trial.entry.as_deref()?;
        let meta = TrialMeta::parse(text)?;
        let (set, clear) = self.one_shot();
        Some(PendingTrial {
            path: self.trial_path(),
            meta,
            cleanup: vec![clear],
            one_shot_pending: self.trial.one_shot,
            set_one_shot: set,
            fingerprint: trial::fingerprint(text),
        })
    }
}

impl Bls {
    /// The backend of the entries in `dir`; None when it has no kernel entry (or does
    /// not exist). An empty or unparsable entry is [`NoBackend`].
    pub(super) fn probe(root: &Sysroot, dir: &str) -> Result<Option<Bls>, NoBackend> {
        let Some((mut entries, rescue)) = read_entries(root, dir)? else {
            return Ok(None);
        };
        if entries.is_empty() {
            return Ok(None);
        }
        // newest kernel first: the reference for "next boot"
        entries.reverse();
        let (mut sources, mut boot_with, grubenv_needed) = entry_sources(&entries);
        let mut problem = None;
        let mut kernelopts = None;
        if grubenv_needed {
            match grubenv_source(root)? {
                Ok(s) => {
                    kernelopts = Some(s.cmdline.render());
                    sources.insert(0, s)
                }
                Err(why) => problem = Some(why),
            }
        }
        let (agreement, refused) = agreement_sources(root)?;
        sources.extend(agreement);
        problem = problem.or(refused);
        let left_alone = rescue_entries(&rescue, grubenv_needed, &mut boot_with);
        let trial = trial_base(root, dir, &entries[0], kernelopts.as_deref())?;
        Ok(Some(Bls {
            entries_dir: dir.to_string(),
            kernel_entries: entries.len(),
            sources,
            problem,
            boot_with,
            left_alone,
            trial,
        }))
    }
}

/// What a trial needs: the loader (GRUB when `/boot/grub2/grub.cfg` exists and the
/// entries are in `/boot/loader/entries`), the newest entry with `$kernelopts` expanded,
/// the trial entry on the node and whether its one-shot is still set.
fn trial_base(
    root: &Sysroot,
    dir: &str,
    newest: &KernelEntry,
    kernelopts: Option<&str>,
) -> Result<TrialBase, NoBackend> {
    let err = |e: inplace_node::sysroot::SysrootError| NoBackend(e.to_string());
    let grub =
        dir == "/boot/loader/entries" && root.stat("/boot/grub2/grub.cfg").map_err(err)?.is_some();
    let loader = if grub {
        Loader::Grub
    } else {
        Loader::SystemdBoot
    };
    let (_, text, entry) = newest;
    let raw = entry.options().unwrap_or_default();
    let options = match kernelopts {
        Some(k) => raw.replace("${kernelopts}", k).replace("$kernelopts", k),
        None if raw.contains("$kernelopts") => String::new(),
        None => raw,
    };
    let newest = (!options.is_empty() || kernelopts.is_none())
        .then(|| (text.clone(), Cmdline::parse(&options)));
    let entry = read_text(root, &format!("{dir}/{}.conf", trial::TRIAL_ID))?;
    let one_shot = match loader {
        Loader::Grub => root
            .read("/boot/grub2/grubenv")
            .ok()
            .flatten()
            .and_then(|b| inplace_formats::grubenv::get(&b, "next_entry").ok())
            .map(|v| v.as_deref() == Some(trial::TRIAL_ID)),
        Loader::SystemdBoot => root.stat(ONE_SHOT_EFIVAR).ok().map(|e| e.is_some()),
    };
    Ok(TrialBase {
        loader,
        newest,
        entry,
        one_shot,
    })
}

/// The `*.conf` entries of `dir` in name order, split into kernel entries and rescue
/// entries; None when `dir` does not exist.
fn read_entries(
    root: &Sysroot,
    dir: &str,
) -> Result<Option<(Vec<KernelEntry>, Rescue)>, NoBackend> {
    let Some(names) = root.list_dir(dir).map_err(|e| NoBackend(e.to_string()))? else {
        return Ok(None);
    };
    let mut entries = Vec::new();
    let mut rescue = Vec::new();
    // the trial entry is the trial's artefact, never a source ([`super::trial`])
    let trial = format!("{}.conf", trial::TRIAL_ID);
    for n in names
        .iter()
        .filter(|n| n.ends_with(".conf") && **n != trial)
    {
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
    Ok(Some((entries, rescue)))
}

/// The options line of each kernel entry that has its own, the description of how each
/// entry boots with a change, and whether any reads `$kernelopts` (grubenv).
fn entry_sources(entries: &[KernelEntry]) -> (Vec<Source>, Vec<String>, bool) {
    let mut sources = Vec::new();
    let mut grubenv_needed = false;
    let mut boot_with = Vec::new();
    for (path, text, entry) in entries {
        let vars = entry.uses_variables();
        if vars.iter().any(|v| v == "kernelopts") {
            grubenv_needed = true;
            boot_with.push(format!("{} ({THROUGH_GRUBENV})", entry.file_name()));
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
    (sources, boot_with, grubenv_needed)
}

/// `kernelopts` in `/boot/grub2/grubenv`, for entries that read `$kernelopts`; the
/// inner error is the backend's problem (unset, missing, malformed).
fn grubenv_source(root: &Sysroot) -> Result<Result<Source, String>, NoBackend> {
    let p = "/boot/grub2/grubenv";
    Ok(match root.read(p).map_err(|e| NoBackend(e.to_string()))? {
        Some(bytes) => match grubenv::get(&bytes, "kernelopts") {
            Ok(Some(v)) => Ok(Source {
                path: p.into(),
                what: "kernelopts in grubenv",
                cmdline: Cmdline::parse(&v),
                bytes,
                format: SourceFormat::Grubenv,
            }),
            Ok(None) => Err(format!(
                "BLS entries use $kernelopts but {p} does not set kernelopts (grub.cfg's fallback value is not edited); run grub2-mkconfig first"
            )),
            Err(e) => Err(format!("{p}: {e}")),
        },
        None => Err(format!(
            "BLS entries use $kernelopts but {p} does not exist"
        )),
    })
}

/// `/etc/kernel/cmdline` and `GRUB_CMDLINE_LINUX`, when present: kept in agreement so a
/// kernel installed later boots with the same arguments. The second value is why the
/// backend can not edit them: an `/etc/kernel/cmdline` that kernel-install would pass to
/// the kernel wrongly (a byte-order mark, [`inplace_formats::cmdline::plain_file_problem`])
/// is refused naming it and the fix, never written around.
fn agreement_sources(root: &Sysroot) -> Result<(Vec<Source>, Option<String>), NoBackend> {
    let mut sources = Vec::new();
    let mut problem = None;
    if let Some(text) = read_text(root, "/etc/kernel/cmdline")? {
        if let Some(why) = inplace_formats::cmdline::plain_file_problem(&text) {
            problem = Some(format!(
                "/etc/kernel/cmdline {why}; remove the 3 bytes (sed -i '1s/^\\xEF\\xBB\\xBF//' /etc/kernel/cmdline), then apply again"
            ));
        }
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
    Ok((sources, problem))
}

/// The rescue entries left alone, described; one that reads `$kernelopts` boots with
/// the change all the same (grubby's layout on RHEL 8) and is added to `boot_with`.
fn rescue_entries(
    rescue: &[bls::Entry],
    grubenv_needed: bool,
    boot_with: &mut Vec<String>,
) -> Vec<String> {
    let mut left_alone = Vec::new();
    for e in rescue {
        if grubenv_needed && e.uses_variables().iter().any(|v| v == "kernelopts") {
            boot_with.push(format!(
                "{} (rescue entry, {THROUGH_GRUBENV})",
                e.file_name()
            ));
        } else {
            left_alone.push(format!("{} (rescue entry, its own options)", e.file_name()));
        }
    }
    left_alone
}
