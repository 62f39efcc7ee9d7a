//! Trial boots: a kernel-argument change boots its new command line **once**, while the
//! old one stays the boot loader's default; the agent makes it the default only after a
//! healthy boot (see `apply/after_boot.rs`), and a failed trial lands on the old default
//! by itself.
//!
//! The trial is a separate boot entry (the *artefact*), written only while a trial is
//! pending, and selected for one boot by the boot loader's one-shot mechanism:
//!
//! - GRUB with `/etc/default/grub`: `/etc/grub.d/99_inplaced_trial` emits one menu entry
//!   with the id `inplaced-trial` (10_linux's entry of the newest kernel, run again with
//!   the trial's `GRUB_CMDLINE_LINUX`), placed after every other script so no menu index
//!   moves; `grub-reboot inplaced-trial` (`grub2-reboot` on the RPM family) sets
//!   `next_entry` in grubenv. The header grub-mkconfig generates from `00_header` loads
//!   grubenv and, when `next_entry` is set, boots it as the default, clears it and saves
//!   the environment *before* booting (`set default="${next_entry}"; set next_entry=;
//!   save_env next_entry; set boot_once=true`): GRUB manual, "Environment block" and
//!   `grub-reboot`; `util/grub.d/00_header.in` upstream and in Debian's/Ubuntu's grub2.
//!   The agent checks the generated `grub.cfg` holds that block before it relies on it.
//! - BLS entries read by GRUB (Fedora, RHEL 9+): a Type #1 entry `inplaced-trial.conf`
//!   beside the others, a copy of the newest kernel's entry with the trial's `options`
//!   and `version 0~inplaced.trial` (sorts last, so it never becomes the default by
//!   position), booted once with `grub2-reboot inplaced-trial` (the same `next_entry`
//!   block; blscfg names an entry by its file name without `.conf`).
//! - RHEL 8 (`options $kernelopts`): the same trial entry, with `$kernelopts` expanded
//!   from grubenv into its own options line, so grubenv's `kernelopts` (the default of
//!   every entry) is not touched until the commit.
//! - systemd-boot (entries on the ESP): the same trial entry, selected for one boot with
//!   `bootctl set-oneshot inplaced-trial.conf`, which sets the `LoaderEntryOneShot` EFI
//!   variable; systemd-boot removes it when it reads it (Boot Loader Interface,
//!   <https://systemd.io/BOOT_LOADER_INTERFACE/>; Boot Loader Specification,
//!   <https://uapi-group.org/specifications/specs/boot_loader_specification/>, "Sorting").
//! - rpm-ostree: no one-shot boot of a deployment exists (`rpm-ostree kargs` stages a new
//!   default deployment, the previous one stays as `rpm-ostree rollback`'s target): the
//!   change is covered without a trial, and coverage says so.
//!
//! Every trial command line ends with `panic=10` (a panic reboots after 10 s, into the
//! old default, since the one-shot is consumed) unless it already asks for a reboot on
//! panic, and `systemd.watchdog_sec=60` (systemd arms the hardware watchdog as PID 1
//! starts, for this boot only: systemd(1), "Kernel Command Line"; a hang after that
//! resets the machine into the old default). The artefact carries, in one comment line,
//! what the commit or the rollback needs ([`TrialMeta`]).

use inplace_formats::cmdline::{Arg, Cmdline};

/// The trial entry's id: GRUB's menu entry id, the BLS entry's file stem.
pub(crate) const TRIAL_ID: &str = "inplaced-trial";
/// The GRUB script that emits the trial entry while a trial is pending.
pub(crate) const GRUB_SCRIPT: &str = "/etc/grub.d/99_inplaced_trial";
/// Seconds a panicking trial kernel waits before it reboots (`panic=`).
pub(crate) const PANIC_SECS: u32 = 10;
/// The hardware watchdog timeout systemd arms for the trial boot
/// (`systemd.watchdog_sec=`, seconds).
pub(crate) const WATCHDOG_SECS: u32 = 60;
/// The marker of the artefact's metadata line.
const META_MARK: &str = "# inplaced-trial ";

/// What a pending trial needs at its end, carried in its artefact.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TrialMeta {
    /// Arguments the change removes (exact occurrences).
    pub remove: Vec<String>,
    /// Arguments the change appends, in order.
    pub append: Vec<String>,
    /// The arguments the agent owned before the change (restored in the applied record
    /// on a rollback).
    pub previous: Vec<String>,
    /// The trial's whole command line as configured (for the evidence).
    pub cmdline: String,
}

impl TrialMeta {
    /// The metadata comment line (`# inplaced-trial {json}`), newline-terminated.
    pub fn render(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        format!("{META_MARK}{json}\n")
    }

    /// The metadata of an artefact's text; None when it has no (valid) metadata line.
    pub fn parse(text: &str) -> Option<TrialMeta> {
        text.lines()
            .find_map(|l| l.strip_prefix(META_MARK))
            .and_then(|j| serde_json::from_str(j).ok())
    }

    /// The removed arguments, parsed.
    pub fn remove_args(&self) -> Vec<Arg> {
        self.remove
            .iter()
            .filter_map(|a| Arg::parse_one(a).ok())
            .collect()
    }

    /// The appended arguments, parsed.
    pub fn append_args(&self) -> Vec<Arg> {
        self.append
            .iter()
            .filter_map(|a| Arg::parse_one(a).ok())
            .collect()
    }
}

/// One artefact file of a trial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialWrite {
    /// Node path.
    pub path: String,
    /// Full content.
    pub content: Vec<u8>,
    /// Mode when created.
    pub mode: u32,
    /// Fingerprint of the file now (`absent`, or `sha256:<hex>` of a stale artefact).
    pub expect: String,
}

/// How a backend boots a change once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrialPlan {
    /// The artefact.
    pub writes: Vec<TrialWrite>,
    /// Commands run after the writes, in order (regeneration, then the one-shot).
    pub commands: Vec<Vec<String>>,
    /// The command that clears the one-shot again (the undo of the last command).
    pub clear_one_shot: Vec<String>,
    /// The mechanism, for the coverage reason.
    pub how: String,
}

/// A trial found on the node (its artefact exists).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTrial {
    /// The artefact's node path.
    pub path: String,
    /// What it carries.
    pub meta: TrialMeta,
    /// Commands run after the artefact is removed (regeneration, clearing the one-shot).
    pub cleanup: Vec<Vec<String>>,
    /// Whether the boot loader's one-shot is still set (None: not known): set after a
    /// boot means the trial entry was not booted at all.
    pub one_shot_pending: Option<bool>,
    /// The command that sets the one-shot (the undo of clearing it).
    pub set_one_shot: Vec<String>,
    /// `sha256:<hex>` of the artefact as read.
    pub fingerprint: String,
}

/// `sha256:<hex>` of an artefact's text.
pub(crate) fn fingerprint(text: &str) -> String {
    format!(
        "sha256:{}",
        inplace_node::digest::sha256_hex(text.as_bytes())
    )
}

/// `cmdline` with the trial's safety arguments appended: `panic=10` unless the last
/// `panic=` already reboots (non-zero), `systemd.watchdog_sec=60` unless one is set.
pub(crate) fn with_safety(cmdline: &Cmdline) -> Cmdline {
    let mut add = Vec::new();
    let last_panic = cmdline
        .args()
        .iter()
        .rev()
        .find(|a| a.key() == "panic")
        .and_then(|a| a.value().map(str::to_string));
    let reboots = last_panic
        .and_then(|v| v.trim().parse::<i64>().ok())
        .is_some_and(|n| n != 0);
    if !reboots && let Ok(a) = Arg::parse_one(&format!("panic={PANIC_SECS}")) {
        add.push(a);
    }
    if !cmdline
        .args()
        .iter()
        .any(|a| a.key() == "systemd.watchdog_sec")
        && let Ok(a) = Arg::parse_one(&format!("systemd.watchdog_sec={WATCHDOG_SECS}"))
    {
        add.push(a);
    }
    cmdline.apply(&[], &add)
}

/// The change applied to `base` (removals, then the appends `base` lacks), the way
/// [`super::Source`] edits a source.
pub(crate) fn changed(base: &Cmdline, remove: &[Arg], append: &[Arg]) -> Cmdline {
    let removed = base.apply(remove, &[]);
    let mut have: Vec<Arg> = removed.args().to_vec();
    let mut add = Vec::new();
    for a in append {
        if let Some(i) = have.iter().position(|h| h.matches_exactly(a)) {
            have.remove(i);
        } else {
            add.push(a.clone());
        }
    }
    removed.apply(&[], &add)
}

/// Single-quotes `s` for a POSIX shell.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Whether a generated `grub.cfg` boots `next_entry` once: the block `00_header` emits
/// (`set default="${next_entry}"` and `save_env next_entry`).
pub(crate) fn grub_cfg_honours_next_entry(cfg: &str) -> bool {
    cfg.contains("set default=\"${next_entry}\"") && cfg.contains("save_env next_entry")
}

/// The GRUB script that emits the trial entry: the first menu entry `10_linux` writes
/// with `GRUB_CMDLINE_LINUX` set to the trial's value (submenus and recovery entries
/// off), renamed to the id [`TRIAL_ID`]; `safety` is appended to
/// `GRUB_CMDLINE_LINUX_DEFAULT` (it comes last on the command line).
pub(crate) fn grub_script(meta: &TrialMeta, linux: &Cmdline, safety: &[Arg]) -> String {
    let safety: Vec<&str> = safety.iter().map(|a| a.as_str()).collect();
    format!(
        r#"#!/bin/sh
# inplaced: the one-shot trial entry of a kernel-argument change. It exists only while the
# trial is pending; inplaced removes it (and runs update-grub) once the trial ends.
{meta}set -e
GRUB_CMDLINE_LINUX={linux}
GRUB_CMDLINE_LINUX_DEFAULT="${{GRUB_CMDLINE_LINUX_DEFAULT}} "{safety}
GRUB_DISABLE_SUBMENU=true
GRUB_DISABLE_RECOVERY=true
export GRUB_CMDLINE_LINUX GRUB_CMDLINE_LINUX_DEFAULT GRUB_DISABLE_SUBMENU GRUB_DISABLE_RECOVERY
"$(dirname "$0")/10_linux" | awk '
  !done && /^menuentry / {{ on = 1
    sub(/^menuentry '"'"'[^'"'"']*'"'"'/, "menuentry '"'"'inplaced trial (kernel arguments, boots once)'"'"'")
    sub(/\$menuentry_id_option '"'"'[^'"'"']*'"'"'/, "$menuentry_id_option '"'"'{id}'"'"'") }}
  on {{ print }}
  on && /^}}/ {{ on = 0; done = 1 }}'
"#,
        meta = meta.render(),
        linux = shell_quote(&linux.render()),
        safety = shell_quote(&safety.join(" ")),
        id = TRIAL_ID,
    )
}

/// The trial BLS entry: `source`'s lines but `title`, `version` and `options`, then the
/// trial's title, a version that sorts last and `options`.
pub(crate) fn bls_entry(meta: &TrialMeta, source: &str, options: &Cmdline) -> String {
    let mut out = String::from(
        "# inplaced: the one-shot trial entry of a kernel-argument change; removed once the trial ends\n",
    );
    out.push_str(&meta.render());
    out.push_str("title inplaced trial (kernel arguments, boots once)\n");
    out.push_str("version 0~inplaced.trial\n");
    for l in source.lines() {
        let key = l.split_whitespace().next().unwrap_or("");
        if key.starts_with('#') || matches!(key, "title" | "version" | "options" | "") {
            continue;
        }
        out.push_str(l);
        out.push('\n');
    }
    out.push_str("options ");
    out.push_str(&options.render());
    out.push('\n');
    out
}

/// Every node path a trial artefact may have: the GRUB script, and the trial entry in
/// each directory of BLS Type #1 entries ([`super::ENTRY_DIRS`]).
pub(crate) fn artefact_paths() -> Vec<String> {
    let mut out = vec![GRUB_SCRIPT.to_string()];
    out.extend(
        super::ENTRY_DIRS
            .iter()
            .map(|d| format!("{d}/{TRIAL_ID}.conf")),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<Arg> {
        Cmdline::parse(s).args().to_vec()
    }

    #[test]
    fn safety_adds_panic_and_watchdog_once() {
        let c = with_safety(&Cmdline::parse("root=/dev/vda1 ro quiet"));
        assert_eq!(
            c.render(),
            "root=/dev/vda1 ro quiet panic=10 systemd.watchdog_sec=60"
        );
        // a panic= that already reboots is kept; panic=0 (wait forever) is overridden
        let c = with_safety(&Cmdline::parse("panic=5 systemd.watchdog_sec=30"));
        assert_eq!(c.render(), "panic=5 systemd.watchdog_sec=30");
        let c = with_safety(&Cmdline::parse("panic=0"));
        assert_eq!(c.render(), "panic=0 panic=10 systemd.watchdog_sec=60");
    }

    #[test]
    fn meta_round_trips_through_its_comment_line() {
        let m = TrialMeta {
            remove: vec!["a=1".into()],
            append: vec!["inplaced.note=\"two words\"".into()],
            previous: vec!["a=1".into()],
            cmdline: "ro a b".into(),
        };
        let text = format!("#!/bin/sh\n{}echo\n", m.render());
        assert_eq!(TrialMeta::parse(&text), Some(m));
        assert_eq!(TrialMeta::parse("#!/bin/sh\n"), None);
    }

    #[test]
    fn changed_removes_then_appends_what_is_missing() {
        let c = changed(
            &Cmdline::parse("ro quiet x=1 y"),
            &args("x=1"),
            &args("y z=2"),
        );
        assert_eq!(c.render(), "ro quiet y z=2");
    }

    #[test]
    fn grub_header_check_needs_the_next_entry_block() {
        let debian = "if [ \"${next_entry}\" ] ; then\n   set default=\"${next_entry}\"\n   set next_entry=\n   save_env next_entry\n   set boot_once=true\nelse\n   set default=\"0\"\nfi\n";
        assert!(grub_cfg_honours_next_entry(debian));
        assert!(!grub_cfg_honours_next_entry("set default=\"0\"\n"));
    }

    #[test]
    fn bls_entry_keeps_kernel_and_initrd_and_replaces_options() {
        let src = "title Fedora (6.1)\nversion 6.1\nlinux /vmlinuz-6.1\ninitrd /initramfs-6.1.img\noptions root=UUID=1 ro\ngrub_class kernel\n";
        let e = bls_entry(
            &TrialMeta::default(),
            src,
            &Cmdline::parse("root=UUID=1 ro x=1 panic=10"),
        );
        assert!(e.contains("\nlinux /vmlinuz-6.1\ninitrd /initramfs-6.1.img\ngrub_class kernel\n"));
        assert!(e.ends_with("options root=UUID=1 ro x=1 panic=10\n"));
        assert!(e.contains("version 0~inplaced.trial\n"));
        assert!(!e.contains("Fedora (6.1)"));
        assert_eq!(e.matches("options ").count(), 1);
    }

    #[test]
    fn grub_script_quotes_the_command_line() {
        let s = grub_script(
            &TrialMeta::default(),
            &Cmdline::parse("quiet it's"),
            &args("panic=10"),
        );
        assert!(s.contains("GRUB_CMDLINE_LINUX='quiet it'\\''s'\n"), "{s}");
        assert!(s.contains("\"${GRUB_CMDLINE_LINUX_DEFAULT} \"'panic=10'\n"));
        assert!(s.contains("'inplaced-trial'"));
    }
}
