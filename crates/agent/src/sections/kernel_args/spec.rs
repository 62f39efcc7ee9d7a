//! The `kernelArgs` section's part of the NodeSpec: kernel arguments, in order, each
//! one that the kernel tokenizes as one argument and that the boot loader passes as
//! written, never one that decides how the node boots. The spec's own list is kept as
//! written (duplicates included); a drop-in adds the arguments the list lacks.

use inplace_wire::names::SpecError;

/// Validates the wire `kernelArgs` of one document. Errors name `kernelArgs[<i>]`.
pub(crate) fn from_pb(p: &[String]) -> Result<Vec<String>, SpecError> {
    let mut out = Vec::with_capacity(p.len());
    for (i, a) in p.iter().enumerate() {
        validate_kernel_arg(&format!("kernelArgs[{i}]"), a)?;
        if let Some(prev) = i.checked_sub(1).and_then(|j| p.get(j)) {
            split_at_comma(i, prev, a)?;
        }
        out.push(a.clone());
    }
    Ok(out)
}

/// Refuses an item that is the rest of the item before it, split at a comma by YAML:
/// in a flow sequence `[console=ttyS1,115200n8]` a comma separates items (YAML 1.2
/// §7.4), so the list arrives as `console=ttyS1` and `115200n8`. The rest of a
/// `key=value` argument split that way starts with a digit and has no `=` (`115200n8`,
/// `isolcpus=2,4` → `4`, `nohz_full=1-3,5` → `5`); no kernel parameter name starts with a
/// digit, and init's runlevel arguments (`1`, `3`) are not for a node managed in place.
/// (`modprobe.blacklist=a,b` splits into a word that can not be told from a flag.)
fn split_at_comma(i: usize, prev: &str, arg: &str) -> Result<(), SpecError> {
    if !prev.contains('=') || arg.contains('=') || !arg.starts_with(|c: char| c.is_ascii_digit()) {
        return Ok(());
    }
    Err(SpecError::new(
        format!("kernelArgs[{i}]"),
        format!(
            "{arg:?} looks like the rest of kernelArgs[{}] {prev:?}, split at a comma: in a YAML flow list [a,b] every comma separates items. Quote the argument (kernelArgs: [\"{prev},{arg}\"]) or write the list one item per line (- {prev},{arg})",
            i - 1
        ),
    ))
}

/// Merges the arguments of a source found under `prefix` into `spec`: the spec's own
/// (`prefix` empty) as written, a drop-in's those `spec` lacks. Never an error: the same
/// argument from two sources is one argument.
pub(crate) fn merge(spec: &mut Vec<String>, part: Vec<String>, prefix: &str) {
    if prefix.is_empty() {
        // the spec's own list is kept as written, duplicates included
        spec.extend(part);
    } else {
        for a in part {
            if !spec.contains(&a) {
                spec.push(a);
            }
        }
    }
}

/// The section's part of the canonical hash: `kernelArgs`, in order (always present: the
/// hash of every spec has it).
pub(crate) fn hash(args: &[String], v: &mut serde_json::Map<String, serde_json::Value>) {
    v.insert("kernelArgs".into(), serde_json::json!(args));
}

/// Validates one kernel argument: non-empty, no NUL/newline, whitespace only inside double
/// quotes, balanced quotes (the kernel's `next_arg()` tokenization).
fn validate_kernel_arg(field: &str, arg: &str) -> Result<(), SpecError> {
    let a = inplace_formats::cmdline::Arg::parse_one(arg)
        .map_err(|e| SpecError::new(field, e.to_string()))?;
    if matches!(
        a.key(),
        "root" | "ro" | "rw" | "BOOT_IMAGE" | "initrd" | "ostree" | "systemd.machine_id"
    ) {
        return Err(SpecError::new(
            field,
            format!(
                "{} is set by the installer or the boot loader and decides how the node boots; inplaced does not manage it",
                a.key()
            ),
        ));
    }
    if arg.contains(['$', '`', '\\']) {
        return Err(SpecError::new(
            field,
            "contains $, ` or \\, which GRUB expands in grub.cfg and BLS options lines; such an argument can not reach the kernel as written",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::from_pb;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_rest_of_an_argument_split_at_a_comma_is_refused() {
        for (list, at) in [
            (&["console=ttyS1", "115200n8"][..], "kernelArgs[1]"),
            (&["quiet", "isolcpus=2", "4"][..], "kernelArgs[2]"),
        ] {
            let e = from_pb(&args(list)).unwrap_err();
            assert_eq!(e.field, at);
            assert!(e.message.contains("Quote the argument"), "{}", e.message);
        }
        let e = from_pb(&args(&["console=ttyS1", "115200n8"])).unwrap_err();
        assert!(
            e.message
                .contains("kernelArgs: [\"console=ttyS1,115200n8\"]"),
            "{}",
            e.message
        );
    }

    #[test]
    fn arguments_with_commas_and_flags_pass() {
        for list in [
            &["console=ttyS1,115200n8", "quiet"][..],
            &["isolcpus=2,4", "nosmt"][..],
            &["quiet", "8250.nr_uarts=4"][..],
            &["console=tty0", "console=ttyS1,115200n8"][..],
        ] {
            assert_eq!(from_pb(&args(list)).unwrap(), args(list));
        }
    }
}
