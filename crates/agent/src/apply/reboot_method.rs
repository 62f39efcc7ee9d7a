//! How the agent reboots for an operation: the reboot method (`reboot_method` in the
//! agent config, `ApplyRequest.reboot_method` per request), and the report of the reboot
//! on the operation (`Operation.reboot`: the method that ran, why, and how long it took).
//!
//! - `full`: `systemctl reboot` ([`Rebooter::reboot`]).
//! - `kexec`: the running kernel's installed image (`/boot/vmlinuz-<release>`, the
//!   release from `/proc/sys/kernel/osrelease`) and its initrd (`/boot/initrd.img-<release>`
//!   on Debian and Ubuntu, `/boot/initramfs-<release>.img` on Fedora and RHEL) loaded with
//!   the new command line by `kexec -s -l` (`kexec_file_load(2)`), then `systemctl kexec`
//!   ([`Rebooter::kexec_load`], [`Rebooter::kexec`]; why kexec-tools and systemd rather
//!   than the raw syscalls: see [`Rebooter`]). No firmware and no boot loader run, so
//!   the new command line reaches the kernel once, as a trial: the next cold boot uses
//!   the boot loader's default. The new command line is the running one
//!   (`/proc/cmdline`) with the arguments the applied kernel arguments remove taken out
//!   and those they add appended: exactly what the verification after the boot asks of
//!   `/proc/cmdline` ([`Agent::kexec_cmdline`]).
//! - `auto`: kexec when the kernel permits it, else a full reboot, with the reason:
//!   `/proc/sys/kernel/kexec_load_disabled` is 1 (kexec(8): no image can be loaded until
//!   the next boot), kernel lockdown is active (`/sys/kernel/security/lockdown` not
//!   `[none]`: kexec_file_load then needs a kernel signed with a trusted key, see
//!   kernel_lockdown(7)), the kernel image or the `kexec` program (kexec-tools) is absent,
//!   or the load itself fails (the kernel refuses the image).
//!
//! The time of a reboot is measured from what the node gives: the wall-clock time the
//! agent asked for it (`RebootReport.requested`, persisted with the operation before the
//! request), the wall-clock time the agent started in the new boot, and `/proc/uptime`
//! then (the new kernel's age, so `seconds - kernel_uptime_seconds` is the shutdown plus,
//! for a full reboot, firmware and boot loader). Wall clocks on both sides of a reboot
//! are the RTC's: good to a second on a node without time sync yet, which is enough to
//! tell a kexec from a POST.

use super::machine::Op;
use super::{Agent, now};
use inplace_node::system::{KexecImage, Rebooter, SystemError};
use inplace_wire::pb;
use inplace_wire::pb::RebootMethod;

/// What the node says about kexec, read through the sysroot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KexecFacts {
    /// `/proc/sys/kernel/kexec_load_disabled`, trimmed (None: unreadable).
    pub disabled: Option<String>,
    /// `/sys/kernel/security/lockdown`, trimmed (None: no such file, no lockdown LSM).
    pub lockdown: Option<String>,
    /// The running kernel's release (`/proc/sys/kernel/osrelease`).
    pub release: Option<String>,
    /// The installed kernel image of that release, when present.
    pub kernel: Option<String>,
    /// Its initrd, when present.
    pub initrd: Option<String>,
    /// The `kexec` program of kexec-tools is installed.
    pub tool: bool,
}

/// The method decided for one reboot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A full reboot, and why.
    Full(String),
    /// A kexec of `kernel` (and `initrd`), and why.
    Kexec {
        /// Why kexec.
        why: String,
        /// Kernel image.
        kernel: String,
        /// Its initrd.
        initrd: Option<String>,
    },
    /// `kexec` was asked and the node does not permit it: the reboot request fails.
    Refused(String),
}

/// The selected lockdown mode of `/sys/kernel/security/lockdown` (`none [integrity]
/// confidentiality` → `integrity`).
fn lockdown_mode(text: &str) -> Option<&str> {
    let start = text.find('[')?;
    let end = text[start..].find(']')?;
    Some(&text[start + 1..start + end])
}

/// Why the node does not permit a kexec, if it does not.
fn kexec_blocked(f: &KexecFacts) -> Option<String> {
    if f.disabled.as_deref() == Some("1") {
        return Some("/proc/sys/kernel/kexec_load_disabled is 1".into());
    }
    if let Some(mode) = f.lockdown.as_deref().and_then(lockdown_mode)
        && mode != "none"
    {
        return Some(format!(
            "kernel lockdown is {mode} (/sys/kernel/security/lockdown): a kexec needs a kernel signed with a key it trusts"
        ));
    }
    let Some(release) = &f.release else {
        return Some("the running kernel's release (/proc/sys/kernel/osrelease) is unknown".into());
    };
    if f.kernel.is_none() {
        return Some(format!("no installed kernel image /boot/vmlinuz-{release}"));
    }
    if !f.tool {
        return Some("kexec-tools is not installed (no /usr/sbin/kexec or /sbin/kexec)".into());
    }
    None
}

/// The method for `asked` on a node with `facts` (pure).
pub(crate) fn decide(asked: RebootMethod, facts: &KexecFacts) -> Decision {
    let kexec = |why: String| match &facts.kernel {
        Some(k) => Decision::Kexec {
            why,
            kernel: k.clone(),
            initrd: facts.initrd.clone(),
        },
        None => Decision::Refused("no kernel image".into()),
    };
    match (asked, kexec_blocked(facts)) {
        (RebootMethod::Kexec, None) => kexec("reboot_method kexec".into()),
        (RebootMethod::Kexec, Some(why)) => {
            Decision::Refused(format!("reboot_method kexec, but {why}"))
        }
        (RebootMethod::Auto, None) => kexec("reboot_method auto: the kernel permits kexec".into()),
        (RebootMethod::Auto, Some(why)) => Decision::Full(format!("reboot_method auto: {why}")),
        _ => Decision::Full("reboot_method full".into()),
    }
}

/// `running` with the arguments of `remove` taken out (every occurrence, compared
/// exactly) and those of `add` appended, joined by single spaces.
pub(crate) fn edit_cmdline(running: &str, remove: &[String], add: &[String]) -> String {
    let parsed = inplace_formats::cmdline::Cmdline::parse(running);
    let mut out: Vec<String> = parsed
        .args()
        .iter()
        .map(|a| a.as_str().to_string())
        .filter(|a| !remove.contains(a))
        .collect();
    out.extend(add.iter().cloned());
    out.join(" ")
}

impl Agent {
    /// What the node says about kexec.
    fn kexec_facts(&self) -> KexecFacts {
        let read = |p: &str| {
            self.root
                .read_string(p)
                .ok()
                .flatten()
                .map(|s| s.trim().to_string())
        };
        let exists = |p: &str| self.root.stat(p).ok().flatten().is_some();
        let release = read("/proc/sys/kernel/osrelease").filter(|r| !r.is_empty());
        let kernel = release
            .as_ref()
            .map(|r| format!("/boot/vmlinuz-{r}"))
            .filter(|p| exists(p));
        let initrd = release.as_ref().and_then(|r| {
            [
                format!("/boot/initrd.img-{r}"),
                format!("/boot/initramfs-{r}.img"),
            ]
            .into_iter()
            .find(|p| exists(p))
        });
        KexecFacts {
            disabled: read("/proc/sys/kernel/kexec_load_disabled"),
            lockdown: read("/sys/kernel/security/lockdown"),
            release,
            kernel,
            initrd,
            tool: ["/usr/sbin/kexec", "/sbin/kexec", "/usr/bin/kexec"]
                .iter()
                .any(|p| exists(p)),
        }
    }

    /// The command line the next boot gets for `op`: see the module docs. Errors when
    /// `/proc/cmdline` can not be read.
    pub(super) fn kexec_cmdline(&self, op: &pb::Operation) -> Result<String, String> {
        let (running, found) = self.boot_view(op).map_err(|u| u.to_string())?;
        if running.trim().is_empty() {
            return Err("/proc/cmdline is empty".into());
        }
        Ok(edit_cmdline(&running, &found.lingering, &found.missing))
    }

    /// Prepares the reboot of `op` before it enters Rebooting: decides the method it asks
    /// (for kexec: the command line, and the kernel loaded), and records the report on
    /// it, so that entering Rebooting persists it before the request
    /// ([`Agent::request_reboot`]) and the boot after it can measure the time. An error:
    /// no reboot can be requested (`kexec` asked where it is not permitted, or its load
    /// failed); nothing is recorded but the action.
    pub(super) fn prepare_reboot(&self, op: &mut Op) -> Result<(), SystemError> {
        let asked = match RebootMethod::try_from(op.wire().reboot_method)
            .unwrap_or(RebootMethod::Unspecified)
        {
            RebootMethod::Unspecified => self.config.reboot_method.to_pb(),
            m => m,
        };
        let mut report = pb::RebootReport {
            requested: Some(now()),
            from_boot_id: self.boot_id(),
            ..Default::default()
        };
        let facts = if asked == RebootMethod::Full {
            KexecFacts::default()
        } else {
            self.kexec_facts()
        };
        let decision = match decide(asked, &facts) {
            Decision::Kexec {
                why,
                kernel,
                initrd,
            } => match self.load_kexec(op.wire(), asked, kernel, initrd) {
                Ok(image) => {
                    report.method = RebootMethod::Kexec as i32;
                    report.reason = why;
                    report.kernel = image.kernel;
                    report.initrd = image.initrd.unwrap_or_default();
                    report.command_line = image.cmdline;
                    None
                }
                Err(d) => Some(d),
            },
            other => Some(other),
        };
        match decision {
            Some(Decision::Refused(why)) => {
                return Err(self.reboot_refused(
                    op,
                    SystemError {
                        action: "kexec".into(),
                        detail: why,
                    },
                ));
            }
            Some(Decision::Full(why)) => {
                report.method = RebootMethod::Full as i32;
                report.reason = why;
            }
            _ => {}
        }
        let kexec = report.method == RebootMethod::Kexec as i32;
        op.push_action(if kexec {
            format!("reboot by kexec ({})", report.reason)
        } else {
            format!("full reboot ({})", report.reason)
        });
        op.set_reboot(report);
        Ok(())
    }

    /// Loads `kernel` and `initrd` with the command line of `op` for a kexec; the image
    /// loaded, or what to do instead: a full reboot (`auto`) or nothing (`kexec`).
    fn load_kexec(
        &self,
        op: &pb::Operation,
        asked: RebootMethod,
        kernel: String,
        initrd: Option<String>,
    ) -> Result<KexecImage, Decision> {
        let instead = |what: &str, e: String| {
            if asked == RebootMethod::Auto {
                Decision::Full(format!("reboot_method auto: {what} ({e})"))
            } else {
                Decision::Refused(format!("reboot_method kexec, but {what} ({e})"))
            }
        };
        let cmdline = self
            .kexec_cmdline(op)
            .map_err(|e| instead("the new command line is unknown", e))?;
        let image = KexecImage {
            kernel,
            initrd,
            cmdline,
        };
        self.rebooter
            .kexec_load(&image)
            .map_err(|e| instead("the kexec load failed", e.to_string()))?;
        Ok(image)
    }

    /// Requests the reboot [`Agent::prepare_reboot`] prepared for `op` (now in
    /// Rebooting): `systemctl kexec` into the loaded kernel, or a full reboot.
    pub(super) fn request_reboot(&self, op: &Op) -> Result<(), SystemError> {
        let reason = format!("inplaced operation {}", op.id());
        let rebooter: &dyn Rebooter = self.rebooter.as_ref();
        let kexec = op
            .wire()
            .reboot
            .as_ref()
            .is_some_and(|r| r.method == RebootMethod::Kexec as i32);
        if kexec {
            rebooter.kexec(&reason)
        } else {
            rebooter.reboot(&reason)
        }
    }

    /// A reboot the method refused before anything was requested: noted on `op`.
    fn reboot_refused(&self, op: &mut Op, e: SystemError) -> SystemError {
        op.push_action(format!("reboot not requested: {e}"));
        e
    }

    /// In the boot after the reboot (`boot_id`): the report gets the boot id and the time
    /// from the request to this agent's start, and the kernel's age then.
    pub(super) fn reboot_finished(&self, op: &mut Op, boot_id: &str) {
        let Some(mut report) = op.wire().reboot.clone() else {
            return;
        };
        if !report.to_boot_id.is_empty() {
            return;
        }
        let started = std::time::SystemTime::now()
            .checked_sub(self.started.elapsed())
            .unwrap_or_else(std::time::SystemTime::now);
        let uptime_now: Option<f64> = self
            .root
            .read_string("/proc/uptime")
            .ok()
            .flatten()
            .and_then(|s| s.split_whitespace().next().and_then(|u| u.parse().ok()));
        let age = self.started.elapsed().as_secs_f64();
        if let Some(req) = &report.requested {
            let req = std::time::UNIX_EPOCH
                + std::time::Duration::new(req.seconds.max(0) as u64, req.nanos.max(0) as u32);
            report.seconds = started
                .duration_since(req)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
        }
        report.kernel_uptime_seconds = uptime_now.map(|u| (u - age).max(0.0)).unwrap_or(0.0);
        report.to_boot_id = boot_id.to_string();
        op.set_reboot(report);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permitted() -> KexecFacts {
        KexecFacts {
            disabled: Some("0".into()),
            lockdown: Some("[none] integrity confidentiality".into()),
            release: Some("6.1.0-28-amd64".into()),
            kernel: Some("/boot/vmlinuz-6.1.0-28-amd64".into()),
            initrd: Some("/boot/initrd.img-6.1.0-28-amd64".into()),
            tool: true,
        }
    }

    #[test]
    fn auto_uses_kexec_only_where_the_kernel_permits_it() {
        let ok = permitted();
        assert!(matches!(
            decide(RebootMethod::Auto, &ok),
            Decision::Kexec { .. }
        ));
        assert!(matches!(
            decide(RebootMethod::Kexec, &ok),
            Decision::Kexec { .. }
        ));
        assert_eq!(
            decide(RebootMethod::Full, &ok),
            Decision::Full("reboot_method full".into())
        );
        let cases: [(KexecFacts, &str); 5] = [
            (
                KexecFacts {
                    disabled: Some("1".into()),
                    ..ok.clone()
                },
                "kexec_load_disabled is 1",
            ),
            (
                KexecFacts {
                    lockdown: Some("none [integrity] confidentiality".into()),
                    ..ok.clone()
                },
                "lockdown is integrity",
            ),
            (
                KexecFacts {
                    kernel: None,
                    ..ok.clone()
                },
                "no installed kernel image /boot/vmlinuz-6.1.0-28-amd64",
            ),
            (
                KexecFacts {
                    tool: false,
                    ..ok.clone()
                },
                "kexec-tools is not installed",
            ),
            (
                KexecFacts {
                    release: None,
                    ..ok.clone()
                },
                "release",
            ),
        ];
        for (facts, why) in cases {
            match decide(RebootMethod::Auto, &facts) {
                Decision::Full(r) => assert!(r.contains(why), "{r}"),
                d => panic!("{d:?}"),
            }
            match decide(RebootMethod::Kexec, &facts) {
                Decision::Refused(r) => assert!(r.contains(why), "{r}"),
                d => panic!("{d:?}"),
            }
        }
        // no lockdown LSM at all: permitted
        let no_lsm = KexecFacts {
            lockdown: None,
            ..ok
        };
        assert!(matches!(
            decide(RebootMethod::Auto, &no_lsm),
            Decision::Kexec { .. }
        ));
    }

    #[test]
    fn the_new_command_line_is_the_running_one_edited() {
        assert_eq!(
            edit_cmdline(
                "BOOT_IMAGE=/boot/vmlinuz root=UUID=1 ro quiet mitigations=off",
                &["mitigations=off".into()],
                &["isolcpus=2-3".into()]
            ),
            "BOOT_IMAGE=/boot/vmlinuz root=UUID=1 ro quiet isolcpus=2-3"
        );
    }
}
