//! Overrides listed as staying (issue 27 §4): where the spec no longer manages a kubelet
//! flag or config field (its prior value is restored) but a source the spec does not
//! control overrides it, the restore's reason says so, naming the file, as the
//! kernel-argument section's notes do for grub.d fragments; the report never leaves the
//! operator to believe the restored value is what the kubelet runs with.

use std::collections::BTreeMap;

use super::{dropin_override, unit_literal};
use crate::sections::kit::Input;
use inplace_formats::kubelet::fields as kcfg_fields;

/// What overrides flag `name` of kubeadm-flags.env and stays: the last value set after
/// `$KUBELET_KUBEADM_ARGS` by a variable the command line expands, else a literal there.
pub(super) fn flag(input: &Input<'_>, name: &str) -> Option<String> {
    let k = &input.obs.kubelet;
    let from_env = k
        .extra_args
        .iter()
        .enumerate()
        .filter(|(i, _)| !k.before_kubeadm.contains(i))
        .flat_map(|(_, e)| e.flags.iter().map(move |f| (e, f)))
        .rfind(|(_, f)| f.name == name)
        .map(|(e, f)| (e.place(), f.value.clone().unwrap_or_default()));
    let (place, v) = from_env.or_else(|| {
        unit_literal(input, name, true)
            .map(|(file, v)| (format!("the effective ExecStart of {file}"), v))
    })?;
    Some(format!(
        "; --{name}={v} in {place} comes later on the kubelet command line and stays in effect (the spec does not control it)"
    ))
}

/// What overrides config field `path` and stays: a `--config-dir` drop-in, or a flag
/// (kubeadm's after the plan, a variable's, a literal) that stands for the field.
pub(super) fn field(
    input: &Input<'_>,
    path: &[String],
    final_flags: &BTreeMap<String, Option<String>>,
) -> Option<String> {
    if let Some(why) = dropin_override(input, path) {
        return Some(format!("; note: {why}"));
    }
    let name = kcfg_fields::flag_for(path)?;
    let field = path.join(".");
    if let Some(v) = final_flags.get(&name) {
        return Some(format!(
            "; kubelet flag --{name}={} in {} overrides {field} and stays in effect",
            v.clone().unwrap_or_default(),
            input.config.kubelet.flags_path
        ));
    }
    let k = &input.obs.kubelet;
    let from_env = k.extra_args.iter().rev().find_map(|e| {
        let f = e.flags.iter().rev().find(|f| f.name == name)?;
        Some((e.place(), f.value.clone().unwrap_or_default()))
    });
    let (place, v) = from_env.or_else(|| {
        unit_literal(input, &name, false)
            .map(|(file, v)| (format!("the effective ExecStart of {file}"), v))
    })?;
    Some(format!(
        "; kubelet flag --{name}={v} in {place} overrides {field} and stays in effect (the spec does not control it)"
    ))
}
