//! The `grub` backend: `GRUB_CMDLINE_LINUX` in `/etc/default/grub` (or the
//! `/etc/default/grub.d/*.cfg` fragment that assigns it last), regenerated with the
//! distribution's `update-grub` or `grub2-mkconfig`. Trial boots: a `/etc/grub.d` script
//! emits the trial entry, booted once through `next_entry` ([`super::trial`]).

use super::trial::{self, PendingTrial, TrialMeta, TrialPlan, TrialWrite};
use super::{KernelArgsBackend, NoBackend, Source, SourceFormat, read_text};
use inplace_formats::cmdline::{Arg, Cmdline};
use std::sync::Arc;

use inplace_formats::grub_default::Fragment;
use inplace_node::sysroot::{Probe, Sysroot};

/// `GRUB_CMDLINE_LINUX` in `/etc/default/grub` or, when a `/etc/default/grub.d/*.cfg`
/// reassigns it, in the last such file (where the setting takes effect).
#[derive(Debug)]
pub(crate) struct GrubDefault {
    sources: Vec<Source>,
    /// `GRUB_CMDLINE_LINUX_DEFAULT` after every fragment, and the file that sets it last.
    default: Option<(String, Cmdline)>,
    notes: Vec<String>,
    problem: Option<String>,
    regenerate: Vec<String>,
    /// The generated `grub.cfg`: its path and text (None when absent).
    grub_cfg: (String, Option<String>),
    /// The trial script, when one is on the node: its text.
    trial_script: Option<String>,
    /// `next_entry` in grubenv (None: no grubenv or no value).
    next_entry: Option<String>,
}

impl GrubDefault {
    /// `grub-reboot` or `grub2-reboot` (the RPM family's name), like the regeneration.
    fn reboot_tool(&self) -> &'static str {
        if self.regenerate[0].starts_with("grub2") {
            "grub2-reboot"
        } else {
            "grub-reboot"
        }
    }

    /// The grubenv beside `grub.cfg`.
    fn grubenv(&self) -> String {
        let cfg = &self.grub_cfg.0;
        format!("{}/grubenv", &cfg[..cfg.rfind('/').unwrap_or(0)])
    }

    /// `grub-editenv <grubenv> unset next_entry`.
    fn clear_next_entry(&self) -> Vec<String> {
        let tool = self.reboot_tool().replace("reboot", "editenv");
        vec![tool, self.grubenv(), "unset".into(), "next_entry".into()]
    }
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
    fn trial(
        &self,
        remove: &[Arg],
        append: &[Arg],
        mut meta: TrialMeta,
    ) -> Result<TrialPlan, String> {
        let (cfg_path, cfg) = &self.grub_cfg;
        let Some(cfg) = cfg else {
            return Err(format!(
                "{cfg_path} does not exist, so whether GRUB boots a one-shot next_entry can not be told"
            ));
        };
        if !trial::grub_cfg_honours_next_entry(cfg) {
            return Err(format!(
                "{cfg_path} does not boot grubenv's next_entry once (no `set default=\"${{next_entry}}\"` and `save_env next_entry` from 00_header)"
            ));
        }
        let linux = trial::changed(&self.next_boot(), remove, append);
        let effective = match &self.default {
            Some((_, d)) => linux.apply(&[], d.args()),
            None => linux.clone(),
        };
        let safe = trial::with_safety(&effective);
        let safety = safe.args()[effective.args().len()..].to_vec();
        meta.cmdline = safe.render();
        let script = trial::grub_script(&meta, &linux, &safety);
        let expect = match &self.trial_script {
            Some(t) => format!("sha256:{}", inplace_node::digest::sha256_hex(t.as_bytes())),
            None => "absent".into(),
        };
        let one_shot = vec![self.reboot_tool().to_string(), trial::TRIAL_ID.to_string()];
        Ok(TrialPlan {
            writes: vec![TrialWrite {
                path: trial::GRUB_SCRIPT.into(),
                content: script.into_bytes(),
                mode: 0o755,
                expect,
            }],
            commands: vec![self.regenerate.clone(), one_shot.clone()],
            clear_one_shot: self.clear_next_entry(),
            how: format!(
                "{} emits the trial entry {}, `{}` boots it once through grubenv's next_entry, which {cfg_path} honours",
                trial::GRUB_SCRIPT,
                trial::TRIAL_ID,
                one_shot.join(" ")
            ),
        })
    }
    fn pending_trial(&self) -> Option<PendingTrial> {
        let text = self.trial_script.as_deref()?;
        let meta = TrialMeta::parse(text)?;
        Some(PendingTrial {
            path: trial::GRUB_SCRIPT.into(),
            meta,
            cleanup: vec![self.regenerate.clone(), self.clear_next_entry()],
            one_shot_pending: Some(self.next_entry.as_deref() == Some(trial::TRIAL_ID)),
            set_one_shot: vec![self.reboot_tool().to_string(), trial::TRIAL_ID.to_string()],
            fingerprint: trial::fingerprint(text),
        })
    }
}

impl GrubDefault {
    /// The backend of `/etc/default/grub` and its fragments; [`NoBackend`] when the file
    /// is missing or `/etc/default/grub.d` can not be listed.
    pub(super) fn probe(root: &Sysroot) -> Result<GrubDefault, NoBackend> {
        let Some(main) = read_fragment(root, "/etc/default/grub")? else {
            return Err(NoBackend(
                "no supported boot configuration found: neither Boot Loader Specification entries nor /etc/default/grub".into(),
            ));
        };
        let fragments = fragments(root, main)?;
        let (path, frag) = last_assigning(&fragments, "GRUB_CMDLINE_LINUX")
            .unwrap_or_else(|| fragments[0].clone());
        let mut problem = None;
        let value = match frag.read_var("GRUB_CMDLINE_LINUX") {
            Ok(v) => v.unwrap_or_default(),
            Err(e) => {
                problem = Some(format!(
                    "{path}: {e} (GRUB_CMDLINE_LINUX takes effect from this file, sourced last by grub-mkconfig)"
                ));
                String::new()
            }
        };
        let default = grub_cmdline_default(&fragments, &mut problem);
        let notes = notes(&fragments, &path);
        let regenerate = regenerate_command(root);
        let cfg_path = if regenerate[0].starts_with("grub2") {
            "/boot/grub2/grub.cfg"
        } else {
            "/boot/grub/grub.cfg"
        };
        let grub_cfg = (cfg_path.to_string(), read_kept_text(root, cfg_path)?);
        let trial_script = read_text(root, trial::GRUB_SCRIPT)?;
        let grubenv = cfg_path.replace("grub.cfg", "grubenv");
        let next_entry = root
            .read(&grubenv)
            .ok()
            .flatten()
            .and_then(|b| {
                inplace_formats::grubenv::get(&b, "next_entry")
                    .ok()
                    .flatten()
            })
            .filter(|v| !v.is_empty());
        Ok(GrubDefault {
            sources: vec![Source {
                path,
                what: "GRUB_CMDLINE_LINUX",
                cmdline: Cmdline::parse(&value),
                bytes: frag.text().as_bytes().to_vec(),
                format: SourceFormat::GrubVar,
            }],
            default,
            notes,
            problem,
            regenerate,
            grub_cfg,
            trial_script,
            next_entry,
        })
    }
}

/// A fragment read as [`read_text`] reads it, lexed; kept in the sysroot's memo while the
/// file stays the same (issue 28: every coverage call lexed each file five times), so
/// that [`GrubDefault::probe`] only combines the files' lexed forms. What is not a
/// regular UTF-8 file is read by [`read_text`] each time, which words the answer.
fn read_fragment(root: &Sysroot, path: &str) -> Result<Option<Arc<Fragment>>, NoBackend> {
    /// The fragment of a regular UTF-8 file the probe read; None for anything else.
    fn lexed(_: &str, found: Probe) -> Option<Arc<Fragment>> {
        text_of(found).map(|t| Arc::new(Fragment::new(t)))
    }
    if let Ok(kept) = root.probe_memo(path, KEPT_MAX, lexed)
        && let Some(f) = kept.as_ref()
    {
        return Ok(Some(f.clone()));
    }
    Ok(read_text(root, path)?.map(|t| Arc::new(Fragment::new(t))))
}

/// [`read_text`], kept in the sysroot's memo while a regular UTF-8 file stays the same
/// (`grub.cfg`, read on every call for a trial's check); anything else is read by
/// [`read_text`] each time, which words the answer.
fn read_kept_text(root: &Sysroot, path: &str) -> Result<Option<String>, NoBackend> {
    fn text(_: &str, found: Probe) -> Option<String> {
        text_of(found)
    }
    if let Ok(kept) = root.probe_memo(path, KEPT_MAX, text)
        && let Some(t) = kept.as_ref()
    {
        return Ok(Some(t.clone()));
    }
    read_text(root, path)
}

/// The text of a regular UTF-8 file a probe read; None for anything else.
fn text_of(found: Probe) -> Option<String> {
    match found {
        Probe::Present {
            entry,
            content: Some(c),
        } if entry.kind == inplace_node::sysroot::Kind::File => String::from_utf8(c).ok(),
        _ => None,
    }
}

/// Largest file kept (a larger one is read each time; `/etc/default/grub` is about
/// 1 KiB, a `grub.cfg` 5–20 KiB; the memo keeps at most 64 KiB per file anyway).
const KEPT_MAX: u64 = 1 << 20;

/// `/etc/default/grub` (`main`, read) and every `/etc/default/grub.d/*.cfg`, as
/// (path, lexed text) in the order grub-mkconfig sources them: the last file that
/// assigns a variable decides its value.
fn fragments(
    root: &Sysroot,
    main: Arc<Fragment>,
) -> Result<Vec<(String, Arc<Fragment>)>, NoBackend> {
    let mut fragments = vec![("/etc/default/grub".to_string(), main)];
    // a directory that can not be listed is not an empty one: a fragment in it may
    // reassign GRUB_CMDLINE_LINUX, so what grub-mkconfig would write is unknown
    let names = root.list_dir_memo("/etc/default/grub.d", false).map_err(|e| {
        NoBackend(format!(
            "{e}; a /etc/default/grub.d/*.cfg file may reassign GRUB_CMDLINE_LINUX, so the next boot's kernel arguments can not be told"
        ))
    })?;
    if let Some(names) = names.as_ref() {
        for n in names.iter().filter(|n| n.ends_with(".cfg")) {
            let p = format!("/etc/default/grub.d/{n}");
            if let Some(t) = read_fragment(root, &p)? {
                fragments.push((p, t));
            }
        }
    }
    Ok(fragments)
}

/// The last fragment that assigns `var`, as (path, lexed text).
fn last_assigning(
    fragments: &[(String, Arc<Fragment>)],
    var: &str,
) -> Option<(String, Arc<Fragment>)> {
    fragments
        .iter()
        .rev()
        .find(|(_, f)| f.assigns(var))
        .map(|(p, f)| (p.clone(), f.clone()))
}

/// The notes of the backend's reason: `GRUB_CMDLINE_LINUX` edited in a fragment
/// (`path`), `GRUB_CMDLINE_LINUX_DEFAULT` overridden by one.
fn notes(fragments: &[(String, Arc<Fragment>)], path: &str) -> Vec<String> {
    let mut notes = Vec::new();
    if path != "/etc/default/grub" {
        notes.push(format!(
            "{path} reassigns GRUB_CMDLINE_LINUX after /etc/default/grub, so it is edited there"
        ));
    }
    if let Some((p, _)) = last_assigning(fragments, "GRUB_CMDLINE_LINUX_DEFAULT")
        && p != "/etc/default/grub"
    {
        notes.push(format!(
            "GRUB_CMDLINE_LINUX_DEFAULT of /etc/default/grub is overridden by {p}; managed arguments go to GRUB_CMDLINE_LINUX in {path}, which takes effect (normal and recovery entries)"
        ));
    }
    notes
}

/// The command that regenerates `grub.cfg`: `grub2-mkconfig -o /boot/grub2/grub.cfg`
/// on the RPM family (by `ID` and `ID_LIKE` of `/etc/os-release`), else `update-grub`.
fn regenerate_command(root: &Sysroot) -> Vec<String> {
    // kept in the sysroot's memo while the file it resolves to keeps its stamp
    fn text(_: &str, t: Option<String>) -> Option<String> {
        t
    }
    let os = root
        .read_following_memo("/etc/os-release", text)
        .ok()
        .and_then(|t| (*t).clone())
        .unwrap_or_default();
    let id_like = format!(
        "{} {}",
        inplace_node::facts::os_release_value(&os, "ID").unwrap_or_default(),
        inplace_node::facts::os_release_value(&os, "ID_LIKE").unwrap_or_default()
    );
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
    if rpm {
        vec![
            "grub2-mkconfig".into(),
            "-o".into(),
            "/boot/grub2/grub.cfg".into(),
        ]
    } else {
        vec!["update-grub".into()]
    }
}

/// `GRUB_CMDLINE_LINUX_DEFAULT` after every fragment (what normal entries read after
/// `GRUB_CMDLINE_LINUX`), described with the file that sets it last; a value that can
/// not be evaluated is a note of the backend's reason and None.
fn grub_cmdline_default(
    fragments: &[(String, Arc<Fragment>)],
    problem: &mut Option<String>,
) -> Option<(String, Cmdline)> {
    const VAR: &str = "GRUB_CMDLINE_LINUX_DEFAULT";
    match Fragment::value_after(fragments.iter().map(|(p, f)| (p.as_str(), &**f)), VAR) {
        Ok(Some(v)) => {
            let from = fragments
                .iter()
                .rev()
                .find(|(_, f)| f.assigns(VAR))
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
