//! Kernel arguments planned against `/etc/default/grub.d` as the operation leaves it
//! (issue 27 §3): the file machinery writes a `files` item's grub.d fragment before the
//! boot configuration is regenerated, and grub-mkconfig sources every
//! `/etc/default/grub.d/*.cfg` after `/etc/default/grub` (the last assignment of a
//! variable wins). A fragment the same spec writes that assigns `GRUB_CMDLINE_LINUX`
//! would replace the edited value, one that assigns `GRUB_CMDLINE_LINUX_DEFAULT` with
//! the same key comes after it on the normal entries' command line: either way the next
//! boot would lack the argument, verification would fail and the operation roll back.
//! Such a change is not covered, naming the `files` item.

use crate::sections::kit::{Input, Output};
use inplace_formats::cmdline::{Arg, Cmdline};
use inplace_formats::grub_default;
use inplace_wire::ids::ChangeId;

/// The grub.d fragments the steps planned before this section write (the file
/// machinery's: a `files` item, or the original restored as one leaves the spec; the
/// first `before` writes, not this section's own edit): (path, text, how the operation
/// comes to write it).
fn fragments(input: &Input<'_>, out: &Output, before: usize) -> Vec<(String, String, String)> {
    out.steps
        .writes
        .iter()
        .take(before)
        .filter(|w| w.path.starts_with("/etc/default/grub.d/") && w.path.ends_with(".cfg"))
        .map(|w| {
            let how = if input.desired.files.iter().any(|f| f.path == w.path) {
                format!("written by {} in this spec", ChangeId::File(w.path.clone()))
            } else {
                format!(
                    "restored as {} leaves the spec",
                    ChangeId::File(w.path.clone())
                )
            };
            (
                w.path.clone(),
                String::from_utf8_lossy(&w.content).into_owned(),
                how,
            )
        })
        .collect()
}

/// Why the change of kernel-argument `key` (the arguments `wanted` for it) would not
/// reach the next boot because of the fragment `text` at `path`; None when it would.
fn problem(
    key: &str,
    wanted: &[Arg],
    (path, text, how): &(String, String, String),
) -> Option<String> {
    if grub_default::assigns(text, "GRUB_CMDLINE_LINUX") {
        return Some(format!(
            "{path} ({how}) assigns GRUB_CMDLINE_LINUX, and grub-mkconfig sources it after /etc/default/grub: it replaces the value the kernel arguments are edited in, so the next boot would not get them; set the arguments under kernelArgs only"
        ));
    }
    if !grub_default::assigns(text, "GRUB_CMDLINE_LINUX_DEFAULT") {
        return None;
    }
    let probe = Arg::parse_one(key).ok()?;
    let shadow = match grub_default::read_var(text, "GRUB_CMDLINE_LINUX_DEFAULT") {
        Ok(v) => Cmdline::parse(&v.unwrap_or_default())
            .args()
            .iter()
            .find(|a| a.same_key(&probe) && !wanted.iter().any(|w| w.matches_exactly(a)))
            .map(|a| a.as_str().to_string()),
        Err(e) => Some(format!("a value that can not be evaluated ({e})")),
    }?;
    Some(format!(
        "{path} ({how}) sets {shadow} in GRUB_CMDLINE_LINUX_DEFAULT, which grub-mkconfig places after GRUB_CMDLINE_LINUX on the kernel command line at the next boot, so it would win over the managed {key}; drop {key} from one of the two items"
    ))
}

/// Marks not covered every kernel-argument change from index `first` on whose edit the
/// grub.d fragments of the first `before` writes would undo.
pub(super) fn refuse(input: &Input<'_>, out: &mut Output, (first, before): (usize, usize)) {
    let frags = fragments(input, out, before);
    if frags.is_empty() {
        return;
    }
    let desired: Vec<Arg> = input
        .desired
        .kernel_args
        .iter()
        .filter_map(|a| Arg::parse_one(a).ok())
        .collect();
    for c in out.changes.iter_mut().skip(first) {
        let Some(key) =
            c.id.strip_prefix("kernelArgs[")
                .and_then(|k| k.strip_suffix(']'))
        else {
            continue;
        };
        if !c.covered || !c.targets.iter().any(|t| t.starts_with("/etc/default/grub")) {
            continue;
        }
        let wanted: Vec<Arg> = desired
            .iter()
            .filter(|a| Arg::parse_one(key).is_ok_and(|k| k.same_key(a)))
            .cloned()
            .collect();
        if let Some(why) = frags.iter().find_map(|f| problem(key, &wanted, f)) {
            c.covered = false;
            c.reason = why;
        }
    }
}

/// A `files` item that writes a grub.d fragment assigning `GRUB_CMDLINE_LINUX` is not
/// covered: once written, that fragment is the file the kernel command line takes effect
/// from, which the kernelArgs section owns (its reserved source), so the verifying
/// re-plan would refuse the item and roll the operation back. Applies whether or not
/// the spec manages kernel arguments; only with the GRUB default-file backend.
pub(super) fn refuse_cmdline_fragments(input: &Input<'_>, out: &mut Output) {
    let grub = match &input.obs.kernel_args.backend {
        Ok(b) => b
            .sources()
            .iter()
            .any(|s| s.path.starts_with("/etc/default/grub")),
        Err(_) => false,
    };
    if !grub {
        return;
    }
    let assigning: Vec<String> = fragments(input, out, out.steps.writes.len())
        .into_iter()
        .filter(|(p, t, _)| {
            input.desired.files.iter().any(|f| &f.path == p)
                && grub_default::assigns(t, "GRUB_CMDLINE_LINUX")
        })
        .map(|(p, _, _)| p)
        .collect();
    for p in assigning {
        let id = ChangeId::File(p.clone()).to_string();
        for c in out.changes.iter_mut().filter(|c| c.id == id && c.covered) {
            c.covered = false;
            c.reason = format!(
                "{p} would assign GRUB_CMDLINE_LINUX after /etc/default/grub, which makes it the file the kernel command line takes effect from, managed by the kernelArgs section; set the arguments under kernelArgs (or assign GRUB_CMDLINE_LINUX_DEFAULT) instead"
            );
        }
    }
}
