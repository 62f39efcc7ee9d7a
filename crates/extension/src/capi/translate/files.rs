//! `files`: whole files and NodeSpec drop-ins (`/etc/inplaced/node.d/*.yaml`).

use std::collections::BTreeSet;

use serde_json::Value;

use super::decode::{DecodeBudget, NodeFile, decode_file_within, kept_dropin, over_config_budget};
use super::schema::{FILE_FIELDS, unknown_members, unknown_reason};
use super::{Analysis, DiffUnit, get, str_of, toks};
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;

/// Agent change ids a drop-in's items produce (best effort; unknown ids are claimed by
/// the `files` unit anyway).
fn dropin_ids(d: &pb::DropIn) -> Vec<String> {
    let mut ids = vec![ChangeId::DropIn(d.name.clone())];
    if let Ok(s) = inplace_wire::yaml::parse(&d.content) {
        ids.extend(s.files.into_iter().map(|f| ChangeId::File(f.path)));
        ids.extend(s.sysctls.into_keys().map(ChangeId::Sysctl));
        if let Some(k) = s.kubelet {
            ids.extend(k.flags.into_keys().map(ChangeId::KubeletFlag));
        }
        if s.ntp.is_some() {
            ids.push(ChangeId::Ntp);
        }
    }
    ids.iter().map(ChangeId::to_string).collect()
}

pub(super) fn files(current: &Value, desired: &Value, root: &[&str], out: &mut Analysis) {
    let tokens = toks(root, &["files"]);
    let list = |v: &Value| {
        get(v, &tokens)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (cur, des) = (list(current), list(desired));
    let mut u = DiffUnit::open(&tokens);
    let mut reasons = Vec::new();
    let mut seen = BTreeSet::new();
    let mut budget = DecodeBudget::default();
    for (i, f) in des.iter().enumerate() {
        let path = str_of(f, "path").unwrap_or("");
        if !seen.insert(path.to_string()) {
            reasons.push(format!("spec.files[{i}] repeats path {path}"));
            continue;
        }
        let before = cur
            .iter()
            .enumerate()
            .find(|(_, c)| str_of(c, "path") == Some(path));
        if before.map(|(_, c)| c) == Some(f) {
            // unchanged, but its bytes count toward the config's total all the same, as
            // UpdateMachine decodes every file (the content is dropped at once)
            if !budget.exceeded
                && let Err(e) = decode_file_within(f, &mut budget)
                && budget.exceeded
            {
                reasons.push(format!("{path}: {e}"));
            }
            continue;
        }
        let at = |j: usize| {
            let mut t = tokens.clone();
            t.push(j.to_string());
            t
        };
        let mut unknown = unknown_members(f, &FILE_FIELDS, &at(i));
        if let Some((j, c)) = before {
            unknown.extend(unknown_members(c, &FILE_FIELDS, &at(j)));
        }
        if let Some(r) = unknown_reason("File", &unknown) {
            reasons.push(format!("{path}: {r}"));
            continue;
        }
        match decode_file_within(f, &mut budget) {
            Ok(NodeFile::File(pf)) => {
                u.ids.push(ChangeId::File(pf.path.clone()).to_string());
                out.delta.files.push(pf);
            }
            Ok(NodeFile::DropIn(d)) => {
                u.ids.extend(dropin_ids(&d));
                u.claims_unknown = true;
                out.delta.dropins.push(d);
            }
            Err(e) => reasons.push(format!("{path}: {e}")),
        }
    }
    for c in &cur {
        let path = str_of(c, "path").unwrap_or("");
        if !des.iter().any(|d| str_of(d, "path") == Some(path)) {
            reasons.push(format!("{path} is no longer listed, but removing a file is not applied in place (the node would keep it)"));
        }
    }
    if !reasons.is_empty() {
        u.blocked = Some(reasons.join("; "));
    }
    out.units.push(u);
}

/// The desired `files` of a bootstrap config into `spec` (files and drop-ins), with a
/// note in `skipped` for each entry that is not sent ([`super::node_spec`]); true when the
/// files went over [`super::MAX_DECODED_CONFIG_BYTES`].
pub(super) fn desired_files(
    desired: &Value,
    root: &[&str],
    spec: &mut pb::NodeSpec,
    skipped: &mut Vec<String>,
) -> bool {
    let files_t = toks(root, &["files"]);
    let mut budget = DecodeBudget::default();
    if let Some(list) = get(desired, &files_t).and_then(Value::as_array) {
        for (i, f) in list.iter().enumerate() {
            let mut at = files_t.clone();
            at.push(i.to_string());
            let decoded = match unknown_reason("File", &unknown_members(f, &FILE_FIELDS, &at)) {
                Some(r) => Err(r),
                None if budget.exceeded => Err(over_config_budget()),
                None => decode_file_within(f, &mut budget),
            };
            match decoded {
                Ok(NodeFile::File(pf)) => spec.files.push(pf),
                Ok(NodeFile::DropIn(d)) => spec.dropins.push(d),
                // A drop-in only the node has rendered (Jinja, a Secret): the agent keeps
                // its copy, which it may have applied at start-up; leaving it out would
                // revert it.
                Err(e) => match kept_dropin(f) {
                    Some(name) => {
                        skipped.push(format!("{name}: the node's copy is kept ({e})"));
                        spec.dropins.push(pb::DropIn {
                            name,
                            content: String::new(),
                            keep: true,
                        });
                    }
                    None => skipped.push(format!("{}: {e}", str_of(f, "path").unwrap_or("?"))),
                },
            }
        }
    }
    budget.exceeded
}
