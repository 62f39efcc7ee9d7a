//! `ntp`: the time servers.

use serde_json::Value;

use super::schema::{NTP_FIELDS, unknown_members, unknown_reason};
use super::{Analysis, DiffUnit, get, toks};
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;

/// The NodeSpec `ntp` for a KubeadmConfig `ntp` value, or why it can not be applied.
/// `None` = nothing to manage (ntp absent or disabled).
pub(super) fn ntp_of(v: Option<&Value>) -> Result<Option<pb::Ntp>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    if !v.is_object() {
        return Err("ntp must be an object with servers and enabled".into());
    }
    if v.get("enabled")
        .is_some_and(|e| !e.is_boolean() && !e.is_null())
    {
        return Err("ntp.enabled must be a boolean".into());
    }
    if v.get("enabled").and_then(Value::as_bool) == Some(false) {
        return Ok(None);
    }
    let mut servers = Vec::new();
    match v.get("servers") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            for (i, s) in a.iter().enumerate() {
                let s = s
                    .as_str()
                    .ok_or_else(|| format!("ntp.servers[{i}] must be a string"))?;
                servers.push(s.to_string());
            }
        }
        Some(_) => return Err("ntp.servers must be a list of strings".into()),
    }
    if servers.is_empty() {
        return Err("ntp without servers means the distribution's default pools, which the agent does not know".into());
    }
    Ok(Some(pb::Ntp { servers }))
}

pub(super) fn ntp(current: &Value, desired: &Value, root: &[&str], out: &mut Analysis) {
    let tokens = toks(root, &["ntp"]);
    let mut u = DiffUnit {
        ids: vec![ChangeId::Ntp.to_string()],
        ..DiffUnit::open(&tokens)
    };
    let (cv, dv) = (get(current, &tokens), get(desired, &tokens));
    let mut unknown = Vec::new();
    for v in [dv, cv].into_iter().flatten() {
        unknown.extend(unknown_members(v, &NTP_FIELDS, &tokens));
    }
    if let Some(r) = unknown_reason("NTP", &unknown) {
        u.blocked = Some(r);
        out.units.push(u);
        return;
    }
    let before = ntp_of(cv).ok().flatten();
    match ntp_of(dv) {
        Ok(Some(n)) => out.delta.ntp = Some(n),
        Ok(None) if before.is_some() => {
            u.blocked = Some("removing ntp (or turning it off) would leave the configured servers in place; the agent can not restore the image's defaults".into())
        }
        Ok(None) => u.ids.clear(),
        Err(e) => u.blocked = Some(e),
    }
    out.units.push(u);
}

/// The desired `ntp` of a bootstrap config (`None`: nothing to manage, or not sent, with
/// a note in `skipped`; [`super::node_spec`]).
pub(super) fn desired_ntp(
    desired: &Value,
    root: &[&str],
    skipped: &mut Vec<String>,
) -> Option<pb::Ntp> {
    let ntp_t = toks(root, &["ntp"]);
    let ntp_v = get(desired, &ntp_t);
    match unknown_reason(
        "NTP",
        &ntp_v.map_or(vec![], |v| unknown_members(v, &NTP_FIELDS, &ntp_t)),
    ) {
        Some(r) => {
            skipped.push(format!("ntp: {r}"));
            None
        }
        None => ntp_of(ntp_v).unwrap_or_else(|e| {
            skipped.push(format!("ntp: {e}"));
            None
        }),
    }
}
