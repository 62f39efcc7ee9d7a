//! `joinConfiguration.nodeRegistration.kubeletExtraArgs`: kubelet flags.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::schema::{ARG_FIELDS, KUBEADM_API_VERSION, unknown_members, unknown_reason};
use super::{Analysis, DiffUnit, get, has_jinja, str_of, toks};
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;

/// `kubeletExtraArgs` (a v1beta2 list of `{name, value}`; `value` may be omitted) as
/// name → value. Errors name a repeated argument, a member that is not a string, and the
/// v1beta1 map shape, which CAPI never sends (see
/// [`super::kubeadm_api_version_problem`]).
pub fn kubelet_args_of(v: Option<&Value>) -> Result<BTreeMap<String, String>, String> {
    let mut m = BTreeMap::new();
    match v {
        Some(Value::Array(a)) => {
            for (i, e) in a.iter().enumerate() {
                let (Some(name), Some(value)) = (
                    str_of(e, "name"),
                    e.get("value").map_or(Some(""), Value::as_str),
                ) else {
                    return Err(format!(
                        "kubeletExtraArgs[{i}]: name and value must be strings"
                    ));
                };
                let (name, value) = (name.to_string(), value.to_string());
                if m.insert(name.clone(), value).is_some() {
                    return Err(format!("kubeletExtraArgs lists {name} twice"));
                }
            }
        }
        Some(Value::Object(_)) => {
            return Err(format!(
                "kubeletExtraArgs is a map (the v1beta1 shape); at {KUBEADM_API_VERSION} it is a list of {{name, value}}"
            ));
        }
        None | Some(Value::Null) => {}
        Some(_) => return Err("kubeletExtraArgs must be a list of {name, value}".into()),
    }
    Ok(m)
}

/// Pointers of the unknown members of the `kubeletExtraArgs` entries of `list` (at
/// `tokens`) that are not identical to an entry of `other`.
pub(super) fn changed_arg_unknowns(
    list: Option<&Value>,
    other: Option<&Value>,
    tokens: &[String],
) -> Vec<String> {
    let empty = vec![];
    let others = other.and_then(Value::as_array).unwrap_or(&empty);
    let mut out = Vec::new();
    for (i, e) in list
        .and_then(Value::as_array)
        .unwrap_or(&empty)
        .iter()
        .enumerate()
    {
        if others.contains(e) {
            continue;
        }
        let mut t = tokens.to_vec();
        t.push(i.to_string());
        out.extend(unknown_members(e, &ARG_FIELDS, &t));
    }
    out
}

pub(super) fn kubelet_args(current: &Value, desired: &Value, root: &[&str], out: &mut Analysis) {
    let tokens = toks(
        root,
        &["joinConfiguration", "nodeRegistration", "kubeletExtraArgs"],
    );
    let (cv, dv) = (get(current, &tokens), get(desired, &tokens));
    let mut unknown = changed_arg_unknowns(dv, cv, &tokens);
    unknown.extend(changed_arg_unknowns(cv, dv, &tokens));
    if let Some(r) = unknown_reason("Arg", &unknown) {
        out.units.push(DiffUnit::blocked(&tokens, r));
        return;
    }
    let (c, d) = match (kubelet_args_of(cv), kubelet_args_of(dv)) {
        (Ok(c), Ok(d)) => (c, d),
        (Err(e), _) | (_, Err(e)) => {
            out.units.push(DiffUnit::blocked(&tokens, e));
            return;
        }
    };
    let names: BTreeSet<&String> = c.keys().chain(d.keys()).collect();
    let mut whole = DiffUnit::open(&tokens);
    let mut reasons = Vec::new();
    let flags = &mut out.delta.kubelet.get_or_insert_with(Default::default).flags;
    for n in names {
        let (before, after) = (c.get(n), d.get(n));
        if before == after {
            continue;
        }
        let reason = match (before, after) {
            (Some(_), None) => Some(format!(
                "removing kubelet argument {n} is not applied in place (kubeadm-flags.env would keep it)"
            )),
            (_, Some(v)) if has_jinja(v) || before.is_some_and(|b| has_jinja(b)) => Some(format!(
                "kubelet argument {n} holds cloud-init Jinja, which only the node renders at provisioning"
            )),
            _ => None,
        };
        if reason.is_none() {
            flags.insert(n.clone(), after.cloned().unwrap_or_default());
        }
        whole.ids.push(ChangeId::KubeletFlag(n.clone()).to_string());
        reasons.extend(reason);
    }
    if out
        .delta
        .kubelet
        .as_ref()
        .is_some_and(|k| k.flags.is_empty() && k.config.is_none())
    {
        out.delta.kubelet = None;
    }
    if !reasons.is_empty() {
        whole.blocked = Some(reasons.join("; "));
    }
    out.units.push(whole);
}

/// The desired kubelet flags of a bootstrap config (`None`: none to send), with a note in
/// `skipped` for each argument that is not sent ([`super::node_spec`]): one with members
/// the translation does not read, or rendered by cloud-init Jinja on the node.
pub(super) fn desired_flags(
    desired: &Value,
    root: &[&str],
    skipped: &mut Vec<String>,
) -> Option<pb::Kubelet> {
    let args_t = toks(
        root,
        &["joinConfiguration", "nodeRegistration", "kubeletExtraArgs"],
    );
    let args_v = get(desired, &args_t);
    let unknown = changed_arg_unknowns(args_v, None, &args_t);
    let unread: BTreeSet<&str> = args_v
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| {
            e.as_object()
                .is_some_and(|m| m.keys().any(|k| !ARG_FIELDS.contains(&k.as_str())))
        })
        .filter_map(|e| str_of(e, "name"))
        .collect();
    if let Some(r) = unknown_reason("Arg", &unknown) {
        skipped.push(format!("kubeletExtraArgs: {r}"));
    }
    match kubelet_args_of(args_v) {
        Ok(args) => {
            let mut flags = BTreeMap::new();
            for (n, v) in args {
                if unread.contains(n.as_str()) {
                    continue;
                }
                if has_jinja(&v) {
                    skipped.push(format!("kubelet argument {n}: rendered on the node"));
                } else {
                    flags.insert(n, v);
                }
            }
            (!flags.is_empty()).then_some(pb::Kubelet {
                config: None,
                flags,
            })
        }
        Err(e) => {
            skipped.push(e);
            None
        }
    }
}
