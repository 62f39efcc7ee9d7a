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
        out.push(a.clone());
    }
    Ok(out)
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
