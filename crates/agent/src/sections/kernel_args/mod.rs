//! The `kernelArgs` section (`kernelArgs[<key>]`, and `kernelArgs` for a reboot into
//! arguments already staged): kernel arguments appended to the boot configuration through
//! the detected backend ([`crate::bootloader`]), and removed again exactly as the agent
//! added them. They take effect at the next boot, so they are verified after it in
//! `/proc/cmdline`.

pub(crate) mod effects;
pub(crate) mod observe;
mod own_writes;
pub(crate) mod spec;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::bootloader::KernelArgsBackend;
use crate::config::Config;
use crate::sections::kit::change::{ChangeBuilder, disruption};
use crate::sections::kit::observe::{NodeView, ObserveError};
use crate::sections::kit::steps::Steps;
use crate::sections::kit::{AfterBoot, Boot, DriftView, Input, Output, Section};
use crate::sections::model::Observed;
use crate::state::{AppliedRecord, PendingRemoval, StagedTrial};
use effects::BootCommand;
use inplace_formats::cmdline::{Arg, Cmdline};
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

/// The `kernelArgs` section.
#[derive(Debug)]
pub(crate) struct KernelArgs;

/// Kernel-argument changes of one key (compared with `-`/`_` equivalence).
struct KeyChange {
    key: String,
    removed: Vec<Arg>,
    appended: Vec<Arg>,
}

/// Splits `wanted` into the arguments `have` holds and those it lacks (exact matches,
/// duplicates counted).
fn split(wanted: &[Arg], have: &[Arg]) -> (Vec<Arg>, Vec<Arg>) {
    let mut have = have.to_vec();
    let (mut found, mut missing) = (Vec::new(), Vec::new());
    for w in wanted {
        if let Some(i) = have.iter().position(|h| h.matches_exactly(w)) {
            have.remove(i);
            found.push(w.clone());
        } else {
            missing.push(w.clone());
        }
    }
    (found, missing)
}

/// The whole applied set after a boot, whatever operation staged it: every managed
/// argument of `record` must be in the running command line, and every removal pending
/// from an earlier boot gone (unless the next boot's configuration holds it from
/// another owner).
pub(crate) fn verify_applied(
    record: &crate::state::AppliedRecord,
    boot: &Boot<'_>,
    boot_id: &str,
) -> AfterBoot {
    let run = Cmdline::parse(boot.running);
    let config = Cmdline::parse(boot.next_boot);
    let count = |c: &Cmdline, r: &Arg| c.args().iter().filter(|a| a.matches_exactly(r)).count();
    let lingering = record
        .kernel_args_removed
        .iter()
        .filter(|p| p.boot_id != boot_id)
        .filter_map(|p| Arg::parse_one(&p.arg).ok())
        .filter(|r| count(&run, r) > count(&config, r))
        .map(|r| r.as_str().to_string())
        .collect();
    AfterBoot {
        missing: missing_args(&record.kernel_args, boot.running),
        lingering,
    }
}

/// Managed arguments the running kernel lacks, and pending removals it still has, once
/// the node booted after they were staged: one drift per key (`kernelArgs[<key>]`).
fn running_drift(view: &DriftView<'_>) -> Vec<pb::Drift> {
    let record = view.record;
    let read = |p: &str| view.root.read_string(p).ok().flatten().unwrap_or_default();
    let boot_id = read("/proc/sys/kernel/random/boot_id").trim().to_string();
    let running = read("/proc/cmdline");
    if running.is_empty()
        || boot_id.is_empty()
        || (!record.kernel_args_staged_in.is_empty() && record.kernel_args_staged_in == boot_id)
    {
        return Vec::new();
    }
    let run = Cmdline::parse(&running);
    let mut out = Vec::new();
    for m in missing_args(&record.kernel_args, &running) {
        let key = Arg::parse_one(&m)
            .map(|a| a.key().to_string())
            .unwrap_or(m.clone());
        out.push(pb::Drift {
            since: None,
            id: ChangeId::KernelArg(key.to_string()).to_string(),
            expected: m.clone(),
            observed: format!("/proc/cmdline lacks {m} after a boot"),
        });
    }
    for p in record
        .kernel_args_removed
        .iter()
        .filter(|p| p.boot_id != boot_id)
    {
        if let Ok(a) = Arg::parse_one(&p.arg)
            && run.contains_exact(&a)
        {
            out.push(pb::Drift {
                since: None,
                id: ChangeId::KernelArg(a.key().to_string()).to_string(),
                expected: format!("{} removed", p.arg),
                observed: format!("/proc/cmdline still has {} after a boot", p.arg),
            });
        }
    }
    out
}

/// Args of `wanted` missing from `cmdline` (exact matches, duplicates counted; an
/// argument that does not parse is skipped).
pub(crate) fn missing_args(wanted: &[String], cmdline: &str) -> Vec<String> {
    split(&parse_all(wanted), Cmdline::parse(cmdline).args())
        .1
        .iter()
        .map(|a| a.as_str().to_string())
        .collect()
}

fn parse_all(args: &[String]) -> Vec<Arg> {
    args.iter().filter_map(|a| Arg::parse_one(a).ok()).collect()
}

/// The arguments of one plan: what is removed and added, what the agent owns after it,
/// the running command line.
struct Args {
    to_remove: Vec<Arg>,
    to_add: Vec<Arg>,
    owned: Vec<Arg>,
    running: Option<Cmdline>,
    /// The next boot's effective command line after the removals, before the additions.
    effective: Cmdline,
}

impl Args {
    fn still_running(&self, a: &Arg) -> bool {
        self.running.as_ref().is_some_and(|r| r.contains_exact(a))
    }

    /// Changes grouped by key for the report; the id shows the key as first written.
    fn by_key(&self) -> BTreeMap<String, KeyChange> {
        let norm = |k: &str| k.replace('_', "-");
        let mut by_key: BTreeMap<String, KeyChange> = BTreeMap::new();
        let removed = self.to_remove.iter().map(|a| (a, true));
        for (a, is_removal) in removed.chain(self.to_add.iter().map(|a| (a, false))) {
            let e = by_key.entry(norm(a.key())).or_insert_with(|| KeyChange {
                key: a.key().to_string(),
                removed: Vec::new(),
                appended: Vec::new(),
            });
            if is_removal {
                e.removed.push(a.clone());
            } else {
                e.appended.push(a.clone());
            }
        }
        by_key
    }
}

impl KernelArgs {
    /// Removals staged in this boot and still running (not desired again): they take
    /// effect at the next boot, whatever operation comes in between. Returns them and
    /// the removals the next record keeps pending.
    fn lingering(&self, input: &Input<'_>, args: &Args) -> (Vec<Arg>, Vec<PendingRemoval>) {
        let boot = input.obs.kernel_args.boot_id.clone().unwrap_or_default();
        let mut lingering: Vec<Arg> = Vec::new();
        let mut pending = Vec::new();
        for p in &input.record.kernel_args_removed {
            let Ok(a) = Arg::parse_one(&p.arg) else {
                continue;
            };
            if p.boot_id == boot
                && !boot.is_empty()
                && args.still_running(&a)
                && !args.owned.iter().any(|o| o.matches_exactly(&a))
                && !args.to_remove.iter().any(|r| r.matches_exactly(&a))
            {
                lingering.push(a);
                pending.push(p.clone());
            }
        }
        // every removal is pending in this boot (running or not): after the boot it must
        // be gone, whatever operation comes in between
        for a in &args.to_remove {
            if !boot.is_empty() {
                pending.push(PendingRemoval {
                    arg: a.as_str().to_string(),
                    boot_id: boot.clone(),
                });
            }
        }
        (lingering, pending)
    }

    /// Args on the running command line that do not come from the edited configuration:
    /// on GRUB they come from GRUB_CMDLINE_LINUX_DEFAULT, which follows GRUB_CMDLINE_LINUX.
    fn later(&self, backend: &dyn KernelArgsBackend, args: &Args) -> Vec<Arg> {
        let mut later: Vec<Arg> = Vec::new();
        if backend.name() == "grub"
            && let Some(run) = &args.running
        {
            let mut cfg: Vec<Arg> = backend.next_boot().args().to_vec();
            for a in run.without_bootloader_injected().args() {
                if matches!(a.key(), "root" | "ro" | "rw") {
                    continue;
                }
                if let Some(i) = cfg.iter().position(|c| c.matches_exactly(a)) {
                    cfg.remove(i);
                } else if !args.owned.iter().any(|o| o.matches_exactly(a)) {
                    later.push(a.clone());
                }
            }
        }
        later
    }

    /// Why no argument can be changed at all: the reboot policy, the platform's length
    /// limit, or the backend.
    fn problem(
        &self,
        input: &Input<'_>,
        backend: &dyn KernelArgsBackend,
        args: &Args,
    ) -> Option<String> {
        // unknown is not empty: without the running command line, neither what a change
        // needs (a reboot, or nothing) nor what the boot shows can be told
        let current_len = match &input.obs.kernel_args.proc_cmdline {
            Ok(c) => c.len(),
            Err(u) => {
                return Some(format!(
                    "{u}; the running kernel command line is not known, so whether a change of kernel arguments needs a reboot can not be told"
                ));
            }
        };
        let added: usize = args.to_add.iter().map(|a| a.as_str().len() + 1).sum();
        let removed: usize = args.to_remove.iter().map(|a| a.as_str().len() + 1).sum();
        let projected = (current_len + added).saturating_sub(removed);
        let max = input.config.kernel_args.max_length;
        if input.opts.reboot_forbidden {
            Some("kernel arguments take effect only after a reboot and the reboot policy is FORBIDDEN".to_string())
        } else if projected > max && added > removed {
            Some(format!(
                "the kernel command line would be {projected} bytes ({current_len} now, {added} added, {removed} removed), over the platform limit of {max} bytes (kernel_args.max_length; the kernel truncates longer ones)"
            ))
        } else {
            backend.problem()
        }
    }
}

/// The huge page parameters, whose meaning depends on their order: `hugepages=` applies
/// to the size of the `hugepagesz=` before it (or the default size, which
/// `default_hugepagesz=` sets).
const HUGEPAGE_KEYS: [&str; 3] = ["hugepages", "hugepagesz", "default_hugepagesz"];

fn hugepage_key(a: &Arg) -> Option<&'static str> {
    let k = a.key().replace('-', "_");
    HUGEPAGE_KEYS.into_iter().find(|h| *h == k)
}

/// Why appending `kc`'s huge page argument would change its meaning, if it would: the
/// effective command line already has huge page parameters the agent did not add, and a
/// `hugepages=` without its own `hugepagesz=` before it (or a `default_hugepagesz=`)
/// would be read against them in an order the spec does not say (on GRUB before
/// `GRUB_CMDLINE_LINUX_DEFAULT`, elsewhere after everything).
fn hugepage_order(backend: &dyn KernelArgsBackend, args: &Args, kc: &KeyChange) -> Option<String> {
    let existing: Vec<&str> = args
        .effective
        .args()
        .iter()
        .filter(|a| hugepage_key(a).is_some() && !args.owned.iter().any(|o| o.matches_exactly(a)))
        .map(|a| a.as_str())
        .collect();
    if existing.is_empty() {
        return None;
    }
    let place = match backend.read_after() {
        Some((what, after)) if after.args().iter().any(|a| hugepage_key(a).is_some()) => {
            format!("appended to {}, before {what}", backend.sources()[0].what)
        }
        _ => "appended after them".to_string(),
    };
    for a in &kc.appended {
        let own_size = || {
            let pos = args
                .to_add
                .iter()
                .position(|t| t.matches_exactly(a))
                .unwrap_or(0);
            args.to_add[..pos]
                .iter()
                .any(|t| hugepage_key(t) == Some("hugepagesz"))
        };
        let sensitive = match hugepage_key(a) {
            Some("hugepages") => !own_size(),
            Some("default_hugepagesz") => true,
            _ => false,
        };
        if sensitive {
            return Some(format!(
                "{} is order-sensitive (hugepages= applies to the size of the hugepagesz= before it, or to the default size) and the next boot already has {}; {place}, it would be read against those and reserve pages of another size; give hugepagesz=<size> before it in the spec, or change the huge page settings where they are set",
                a.as_str(),
                existing.join(" ")
            ));
        }
    }
    None
}

/// The report reason of one key's change.
fn key_reason(
    backend: &dyn KernelArgsBackend,
    kc: &KeyChange,
    others: &[&Arg],
    needs_reboot: bool,
    trial: &str,
) -> String {
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
    reason.push_str("; ");
    reason.push_str(&backend.boot_entries());
    if needs_reboot && !trial.is_empty() {
        reason.push_str("; ");
        reason.push_str(trial);
    }
    reason
}

/// Whether a pending trial carries what `desired` no longer wants: an argument it
/// appends that is not desired, or one it removes that is desired again.
fn trial_is_stale(meta: &crate::bootloader::TrialMeta, desired: &[Arg]) -> bool {
    let wanted = |a: &Arg| desired.iter().any(|d| d.matches_exactly(a));
    meta.append_args().iter().any(|a| !wanted(a)) || meta.remove_args().iter().any(wanted)
}

/// The coverage note of a trial: how the change boots once, or why it can not.
fn trial_note(trial: &Result<crate::bootloader::TrialPlan, String>) -> String {
    match trial {
        Ok(t) => format!(
            "trial boot: {}; the old command line stays the default until the node is healthy after that boot (agent up, /proc/cmdline, the kubelet's health), then it is committed; a panic (panic=), a hang (the hardware watchdog systemd arms for that boot) or an unhealthy node lands on the old default and the operation ends RolledBack",
            t.how
        ),
        Err(why) => {
            format!("covered without a trial boot (made the default before the reboot): {why}")
        }
    }
}

/// The change of one key: its operation, the arguments before and after, and a reboot
/// when the running kernel differs from the result.
fn key_change<'a>(
    kc: &KeyChange,
    others: &[&Arg],
    needs_reboot: bool,
    covered: Result<&'a str, String>,
    targets: Vec<String>,
) -> ChangeBuilder<'a> {
    let op = match (kc.removed.is_empty(), kc.appended.is_empty()) {
        (true, false) if others.is_empty() => ChangeOperation::Create,
        (false, true) => ChangeOperation::Delete,
        _ => ChangeOperation::Update,
    };
    let before: Vec<&str> = if kc.removed.is_empty() {
        others.iter().map(|a| a.as_str()).collect()
    } else {
        kc.removed.iter().map(|a| a.as_str()).collect()
    };
    let after: Vec<&str> = kc.appended.iter().map(|a| a.as_str()).collect();
    let level = if needs_reboot {
        DisruptionLevel::Reboot
    } else {
        DisruptionLevel::None
    };
    ChangeBuilder {
        id: ChangeId::KernelArg(kc.key.to_string()).to_string(),
        op,
        before: before.join(" "),
        after: after.join(" "),
        covered,
        disruption: disruption(level, &[]),
        targets,
    }
}

/// What the configuration edit of a plan is: its problem (None = none), the file edits.
struct Edit<'p> {
    problem: &'p Option<String>,
    edits: &'p Result<Vec<crate::bootloader::FileEdit>, String>,
    /// The coverage note of the trial (empty when nothing is edited).
    trial: String,
}

impl KernelArgs {
    /// One change per key; true when a covered one needs a reboot.
    fn key_changes(
        &self,
        out: &mut Output,
        backend: &dyn KernelArgsBackend,
        args: &Args,
        by_key: &BTreeMap<String, KeyChange>,
        edit: Edit<'_>,
    ) -> bool {
        let later = self.later(backend, args);
        let targets: Vec<String> = match edit.edits {
            Ok(e) => e.iter().map(|e| e.path.clone()).collect(),
            Err(_) => vec![],
        };
        let configured = backend.next_boot();
        let mut any_reboot = false;
        for kc in by_key.values() {
            // a reboot is needed only where the running kernel differs from the result
            let needs_reboot = match &args.running {
                None => true,
                Some(run) => {
                    kc.appended.iter().any(|a| !run.contains_exact(a))
                        || kc.removed.iter().any(|r| run.contains_exact(r))
                }
            };
            // huge page parameters accumulate (one pool per size) rather than the last
            // one winning: their order is checked instead (hugepage_order)
            let shadows = |l: &&Arg| {
                hugepage_key(l).is_none()
                    && kc.appended.iter().any(|a| a.same_key(l))
                    && !kc.appended.iter().any(|a| a.matches_exactly(l))
            };
            let shadow = later.iter().find(shadows);
            // what the configuration places after the edited arguments at the next boot
            // (GRUB_CMDLINE_LINUX_DEFAULT), also when the running kernel does not show it yet
            let after = backend.read_after();
            let shadow_after = after
                .as_ref()
                .and_then(|(what, c)| c.args().iter().find(shadows).map(|a| (what, a)));
            let others: Vec<&Arg> = configured
                .args()
                .iter()
                .filter(|c| {
                    kc.appended.iter().any(|a| a.same_key(c))
                        && !args.owned.iter().any(|o| o.matches_exactly(c))
                })
                .collect();
            let reason = key_reason(backend, kc, &others, needs_reboot, &edit.trial);
            let covered = match (edit.problem, edit.edits, shadow) {
                (Some(p), _, _) => Err(p.clone()),
                (None, Err(e), _) => Err(e.clone()),
                (None, Ok(_), _) if let Some(o) = hugepage_order(backend, args, kc) => Err(o),
                (None, Ok(_), _) if let Some((what, a)) = shadow_after => Err(format!(
                    "{} in {what} comes after {} on the kernel command line at the next boot, so it would still win and the change would have no effect; change it there",
                    a.as_str(),
                    backend.sources()[0].what
                )),
                (None, Ok(_), Some(l)) => Err(format!(
                    "{} on the running command line comes from GRUB_CMDLINE_LINUX_DEFAULT (or a grub.d file), which grub-mkconfig places after GRUB_CMDLINE_LINUX, so it would still win; change it there",
                    l.as_str()
                )),
                (None, Ok(_), None) => Ok(reason.as_str()),
            };
            if covered.is_ok() && needs_reboot {
                any_reboot = true;
            }
            out.push(key_change(
                kc,
                &others,
                needs_reboot,
                covered,
                targets.clone(),
            ));
        }
        any_reboot
    }

    /// The steps of the edit: the backend's command, or the file edits and the
    /// regeneration command.
    fn edit_steps(
        &self,
        steps: &mut Steps,
        backend: &dyn KernelArgsBackend,
        args: &Args,
        problem: &Option<String>,
        edits: Result<Vec<crate::bootloader::FileEdit>, String>,
        any_reboot: bool,
    ) {
        let changed = !args.to_remove.is_empty() || !args.to_add.is_empty();
        if problem.is_none()
            && changed
            && let Some(cmd) = backend.command_edit(&args.to_remove, &args.to_add)
        {
            steps.effect(BootCommand {
                argv: cmd,
                edits_args: true,
                undo: None,
            });
            steps.reboot |= any_reboot;
        } else if let (None, Ok(edits)) = (problem, edits)
            && !edits.is_empty()
        {
            for e in edits {
                steps.writes.push(crate::sections::kit::steps::Write {
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
                steps.effect(BootCommand {
                    argv: cmd,
                    edits_args: false,
                    undo: None,
                });
            }
            steps.reboot |= any_reboot;
        }
    }

    /// Staged for the next boot but not running yet: a reboot, no edit.
    fn staged_only(&self, input: &Input<'_>, out: &mut Output, args: &Args, lingering: &[Arg]) {
        let Some(running) = &args.running else {
            return;
        };
        let missing = split(&args.owned, running.args()).1;
        let missing: Vec<&str> = missing.iter().map(|a| a.as_str()).collect();
        let gone: Vec<&str> = lingering.iter().map(|a| a.as_str()).collect();
        if (missing.is_empty() && gone.is_empty()) || input.opts.reboot_forbidden {
            return;
        }
        out.steps.reboot = true;
        // before: removed args the running kernel still has; after: staged args it does
        // not have yet (verify_after_boot reads both as arguments).
        out.push(ChangeBuilder {
            id: ChangeId::KernelArgs.to_string(),
            op: ChangeOperation::Update,
            before: gone.join(" "),
            after: missing.join(" "),
            covered: Ok(
                "already staged in the boot configuration; the running kernel has not booted with it yet: reboot only",
            ),
            disruption: disruption(DisruptionLevel::Reboot, &[]),
            targets: vec![],
        });
    }

    /// Plans the arguments with the backend found.
    fn plan_with(
        &self,
        input: &Input<'_>,
        out: &mut Output,
        backend: &dyn KernelArgsBackend,
        desired: &[Arg],
        (kept, to_remove): (Vec<Arg>, Vec<Arg>),
    ) {
        // the next boot's command line in the order the kernel reads it: a desired
        // argument already there (even from GRUB_CMDLINE_LINUX_DEFAULT) is not added
        let effective = backend.effective_next_boot().apply(&to_remove, &[]);
        // desired args missing from the next boot (counting duplicates)
        let to_add = split(desired, effective.args()).1;
        let mut owned = kept;
        owned.extend(to_add.iter().cloned());
        out.next.kernel_args = owned.iter().map(|a| a.as_str().to_string()).collect();
        // the running command line, parsed once for this section
        let running = input
            .obs
            .kernel_args
            .proc_cmdline
            .as_ref()
            .ok()
            .map(|c| Cmdline::parse(c));
        let args = Args {
            to_remove,
            to_add,
            owned,
            running,
            effective,
        };
        let (lingering, pending) = self.lingering(input, &args);
        out.next.kernel_args_removed = pending;
        out.next.kernel_args_staged_in = match &args.running {
            Some(_) if args.owned.iter().any(|a| !args.still_running(a)) => {
                input.obs.kernel_args.boot_id.clone().unwrap_or_default()
            }
            _ => String::new(),
        };
        let by_key = args.by_key();
        let problem = self.problem(input, backend, &args);
        let edits = if problem.is_none() && !by_key.is_empty() {
            backend.edit(&args.to_remove, &args.to_add)
        } else {
            Ok(Vec::new())
        };
        let trial = match (&problem, &edits) {
            (None, Ok(e))
                if input.config.kernel_args.trial
                    && !by_key.is_empty()
                    && (!e.is_empty() || backend.command_edit(&[], &[]).is_some()) =>
            {
                let meta = crate::bootloader::TrialMeta {
                    remove: args
                        .to_remove
                        .iter()
                        .map(|a| a.as_str().to_string())
                        .collect(),
                    append: args.to_add.iter().map(|a| a.as_str().to_string()).collect(),
                    previous: input.record.kernel_args.clone(),
                    cmdline: String::new(),
                };
                Some(backend.trial(&args.to_remove, &args.to_add, meta))
            }
            _ => None,
        };
        let edit = Edit {
            problem: &problem,
            edits: &edits,
            trial: trial.as_ref().map(trial_note).unwrap_or_default(),
        };
        let any_reboot = self.key_changes(out, backend, &args, &by_key, edit);
        let problem = problem.or_else(|| {
            out.changes
                .iter()
                .find(|c| c.id.starts_with("kernelArgs[") && !c.covered)
                .map(|c| c.reason.clone())
        });
        let changed = !args.to_remove.is_empty() || !args.to_add.is_empty();
        match trial.and_then(Result::ok) {
            // a reboot-level change boots once as a trial; the default waits for the commit
            Some(t) if problem.is_none() && changed && any_reboot => {
                // recorded with the plan (typed), so the boot after it knows a trial was
                // staged even when its entry is lost
                out.next.kernel_args_trial = t.writes.first().map(|w| StagedTrial {
                    artefact: w.path.clone(),
                });
                effects::trial_steps(&mut out.steps, t, backend.pending_trial().as_ref())
            }
            _ => {
                match backend.pending_trial() {
                    // a pending trial this plan does not renew is dropped: its one-shot
                    // must not boot what is no longer wanted
                    Some(p) if problem.is_none() && trial_is_stale(&p.meta, desired) => {
                        effects::drop_trial_steps(&mut out.steps, &p);
                    }
                    // one left pending is still the one staged
                    Some(_) => out.next.kernel_args_trial = input.record.kernel_args_trial.clone(),
                    None => {}
                }
                self.edit_steps(&mut out.steps, backend, &args, &problem, edits, any_reboot)
            }
        }
        if by_key.is_empty() {
            self.staged_only(input, out, &args, &lingering);
        }
    }
}

impl Section for KernelArgs {
    fn name(&self) -> &'static str {
        "kernelArgs"
    }

    /// The backend, with the running command line and the boot id, when arguments are
    /// desired or managed, or a file item may write one of the backend's files (its
    /// sources are reserved even when no argument is managed): [`observe::needed`].
    fn observe(&self, node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
        observe::read(node, obs)
    }

    /// The backend's sources, and every trial artefact path (written only while a trial
    /// is pending).
    fn reserved(&self, _config: &Config, obs: &Observed) -> Vec<(String, String)> {
        let owner = || "the kernelArgs section".to_string();
        let mut out: Vec<(String, String)> = match &obs.kernel_args.backend {
            Ok(b) => b
                .sources()
                .iter()
                .map(|s| (s.path.clone(), owner()))
                .collect(),
            Err(_) => Vec::new(),
        };
        out.push((crate::bootloader::trial::GRUB_SCRIPT.to_string(), owner()));
        for d in crate::bootloader::ENTRY_DIRS {
            out.push((
                format!("{d}/{}.conf", crate::bootloader::trial::TRIAL_ID),
                owner(),
            ));
        }
        out
    }

    fn diff(&self, input: &Input<'_>, out: &mut Output) {
        own_writes::refuse_cmdline_fragments(input, out);
        let (desired, record) = (input.desired, input.record);
        if desired.kernel_args.is_empty()
            && record.kernel_args.is_empty()
            && record.kernel_args_removed.is_empty()
        {
            return;
        }
        let desired = parse_all(&desired.kernel_args);
        // args the agent added that are no longer desired (multiset difference)
        let owned = split(&parse_all(&record.kernel_args), &desired);
        let first = (out.changes.len(), out.steps.writes.len());
        match &input.obs.kernel_args.backend {
            Ok(b) => {
                self.plan_with(input, out, b.as_ref(), &desired, owned);
                own_writes::refuse(input, out, first);
            }
            Err(e) => {
                for a in &desired {
                    out.push(ChangeBuilder {
                        id: ChangeId::KernelArg(a.key().to_string()).to_string(),
                        op: ChangeOperation::Create,
                        before: String::new(),
                        after: a.as_str().to_string(),
                        covered: Err(e.to_string()),
                        disruption: disruption(DisruptionLevel::Reboot, &[]),
                        targets: vec![],
                    });
                }
                out.next.kernel_args = record.kernel_args.clone();
            }
        }
    }

    /// The re-plan after an apply may still list the reboot into staged arguments, and
    /// every argument a tool changes (verified in `/proc/cmdline` only).
    fn verified_after_boot(&self, change: &pb::Change, steps: &Steps) -> bool {
        change.id == "kernelArgs"
            || (steps.effects_of::<BootCommand>().any(|c| c.edits_args)
                && change.id.starts_with("kernelArgs"))
    }

    /// Every argument the operation added (or staged) must be in the running command
    /// line, and every argument it removed must be gone unless the next boot's
    /// configuration still holds it from another owner.
    fn verify_after_boot(&self, changes: &[pb::Change], boot: &Boot<'_>) -> AfterBoot {
        let mut wanted = Vec::new();
        let mut lingering = Vec::new();
        let run = Cmdline::parse(boot.running);
        let config = Cmdline::parse(boot.next_boot);
        for c in changes.iter().filter(|c| c.id.starts_with("kernelArgs")) {
            wanted.extend(
                Cmdline::parse(&c.after)
                    .args()
                    .iter()
                    .map(|a| a.as_str().to_string()),
            );
            for r in Cmdline::parse(&c.before).args() {
                let count = |c: &Cmdline| c.args().iter().filter(|a| a.matches_exactly(r)).count();
                if count(&run) > count(&config) {
                    lingering.push(r.as_str().to_string());
                }
            }
        }
        AfterBoot {
            missing: missing_args(&wanted, boot.running),
            lingering,
        }
    }

    fn verify_applied_after_boot(
        &self,
        record: &AppliedRecord,
        boot: &Boot<'_>,
        boot_id: &str,
    ) -> AfterBoot {
        verify_applied(record, boot, boot_id)
    }

    fn drift(&self, view: &DriftView<'_>) -> Vec<pb::Drift> {
        let record = view.record;
        let mut out = running_drift(view);
        if record.kernel_args.is_empty() {
            return out;
        }
        let Ok(b) = crate::bootloader::detect(view.root, view.config.kernel_args.backend) else {
            return Vec::new();
        };
        // a pending trial carries the arguments until its boot commits them
        if b.pending_trial().is_some() {
            return out;
        }
        let missing = missing_args(&record.kernel_args, &b.next_boot().render());
        if !missing.is_empty() {
            out.push(pb::Drift {
                since: None,
                id: ChangeId::KernelArgs.to_string(),
                expected: record.kernel_args.join(" "),
                observed: format!("next boot lacks {}", missing.join(" ")),
            });
        }
        out
    }

    fn watched(&self, view: &DriftView<'_>) -> Vec<String> {
        if view.record.kernel_args.is_empty() {
            return Vec::new();
        }
        match crate::bootloader::detect(view.root, view.config.kernel_args.backend) {
            Ok(b) => b.sources().iter().map(|s| s.path.clone()).collect(),
            Err(_) => Vec::new(),
        }
    }
}
