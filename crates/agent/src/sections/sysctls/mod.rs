//! The `sysctls` section (`sysctls[<key>]`): kernel parameters written live under
//! `/proc/sys` and persisted in the agent's sysctl.d drop-in; a dropped key gets its prior
//! live value back and leaves the drop-in. sysctl.d files that other sections write (a
//! `files` item) take effect live too, as systemd-sysctl would apply them at boot. The
//! sysctl.d rules are in [`inplace_formats::sysctl`].

pub(crate) mod effects;
pub(crate) mod observe;
pub(crate) mod spec;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use crate::config::Config;
use crate::sections::kit::change::{ChangeBuilder, disruption};
use crate::sections::kit::observe::{NodeView, ObserveError, TextObs, observe_running};
use crate::sections::kit::steps::{Remove, Write};
use crate::sections::kit::{DriftView, Input, Output, Section};
use crate::sections::model::Observed;
use crate::sections::sysctls::effects::SetSysctl;
use crate::sections::sysctls::observe::{SysctlLive, SysctlObs};
use crate::state::{AppliedRecord, ManagedValue};
use inplace_formats::sysctl::{
    boot_value, edit_sysctl_conf, is_sysctl_conf, normalize, parse_sysctl_conf, render_sysctl_conf,
    sysctl_path,
};
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

/// The `sysctls` section.
#[derive(Debug)]
pub(crate) struct Sysctls;

/// Why `key` = `value` can not be managed: no such parameter, read-only, the drop-in
/// unusable, or a sysctl.d file applied after the drop-in at boot that sets it too (as
/// the node will be once the steps so far, `written`, ran: a `files` item of the same
/// spec that writes such a file is named, issue 27 §3).
fn key_problem(
    input: &Input<'_>,
    written: &BTreeMap<String, Option<String>>,
    drop_in_obs: &TextObs,
    live: Option<&SysctlLive>,
    (key, value): (&String, &String),
) -> Option<String> {
    let drop_in = &input.config.sysctl.drop_in;
    let path = sysctl_path(key);
    match live {
        None => Some(format!(
            "{path} does not exist on this node: the key is unknown or its kernel module is not loaded"
        )),
        Some(SysctlLive {
            unknown: Some(u), ..
        }) => Some(format!(
            "{u}; the live value of {key} is not known, so whether setting it changes anything can not be told"
        )),
        Some(l) if !l.writable => Some(format!("{path} is read-only")),
        _ => None,
    }
    .or_else(|| {
        if let TextObs::Problem(p) = drop_in_obs {
            return Some(p.clone());
        }
        if let Some(u) = input.obs.sysctls.unreadable.first() {
            return Some(format!(
                "{u}; a sysctl.d file there may set {key} at boot after {drop_in}, so whether the value would persist can not be told"
            ));
        }
        // a sysctl.d file that sorts after the drop-in would win at boot
        let mut vals = BTreeMap::new();
        vals.insert(key.clone(), value.clone());
        let mut with_ours = written.clone();
        let targets = &input.obs.sysctls.targets;
        with_ours.insert(drop_in.clone(), Some(render_sysctl_conf(&vals)));
        let item_of = |from: &String| {
            input
                .desired
                .files
                .iter()
                .find(|f| f.path == *from || targets.get(from) == Some(&f.path))
                .map(|f| f.path.clone())
        };
        match boot_value(&input.obs.sysctls.files, key, &with_ours) {
            Some((v, from)) if from != *drop_in && item_of(&from).is_some() => Some(format!(
                "{from} (written by {} in this spec) sets {key} = {v} and is applied after {drop_in} at boot, so the value would not persist: keep {key} in one of the two items",
                ChangeId::File(item_of(&from).unwrap_or_default())
            )),
            Some((v, from)) if from != *drop_in => Some(format!(
                "{from} sets {key} = {v} and is applied after {drop_in} at boot, so the value would not persist; remove it there"
            )),
            _ => None,
        }
    })
}

/// The record's entry for `key`, matched by its `/proc/sys` path: the spec may spell a
/// managed key another way than when it was first applied (`vm/swappiness` for
/// `vm.swappiness`), and it is still the same key.
fn recorded<'a>(
    record: &'a AppliedRecord,
    key: &str,
) -> Option<(&'a String, &'a ManagedValue<String>)> {
    let path = sysctl_path(key);
    record
        .sysctls
        .get_key_value(key)
        .or_else(|| record.sysctls.iter().find(|(k, _)| sysctl_path(k) == path))
}

/// True when the spec sets the key `key` names (matched by its `/proc/sys` path).
fn desired_has(desired: &crate::sections::model::NodeSpec, key: &str) -> bool {
    let path = sysctl_path(key);
    desired.sysctls.contains_key(key) || desired.sysctls.keys().any(|k| sysctl_path(k) == path)
}

/// The value text of every line of the drop-in that sets `key` (matched by its
/// `/proc/sys` path), in file order.
fn line_values(text: &str, key: &str) -> Vec<String> {
    let path = sysctl_path(key);
    text.lines()
        .filter_map(|l| {
            let p = parse_sysctl_conf(l);
            let (k, v) = p.into_iter().next()?;
            (sysctl_path(&k) == path).then_some(v)
        })
        .collect()
}

/// The value `parsed` (a [`parse_sysctl_conf`] map) holds for `key`, matched by its
/// `/proc/sys` path as systemd-sysctl does (`net/ipv4/ip_forward` is `net.ipv4.ip_forward`).
fn value_for(parsed: &BTreeMap<String, String>, key: &str) -> Option<String> {
    let path = sysctl_path(key);
    parsed
        .iter()
        .rfind(|(k, _)| sysctl_path(k) == path)
        .map(|(_, v)| v.clone())
}

impl Sysctls {
    /// Plans one desired key: refused, nothing (live and persisted already), or a live
    /// write and a change. Returns whether the key goes into the drop-in.
    fn desired_key(
        &self,
        input: &Input<'_>,
        out: &mut Output,
        drop_in_obs: &TextObs,
        (key, value): (&String, &String),
    ) -> bool {
        let drop_in = &input.config.sysctl.drop_in;
        let id = ChangeId::Sysctl(key.clone()).to_string();
        let path = sysctl_path(key);
        let live = input.obs.sysctls.live.get(key).cloned().flatten();
        let written = sysctl_overrides(input, out);
        let problem = key_problem(input, &written, drop_in_obs, live.as_ref(), (key, value));
        let none = disruption(DisruptionLevel::None, &[]);
        let targets = vec![path, drop_in.clone()];
        if let Some(problem) = problem {
            out.push(ChangeBuilder {
                id,
                op: ChangeOperation::Update,
                before: live.map(|l| l.value).unwrap_or_else(|| "absent".into()),
                after: value.clone(),
                covered: Err(problem),
                disruption: none,
                targets,
            });
            return false;
        }
        let live = live.map(|l| l.value).unwrap_or_default();
        let was = recorded(input.record, key);
        let prior = match was {
            Some((_, m)) => m.prior.clone(),
            None => Some(live.clone()),
        };
        let managed = ManagedValue {
            value: value.clone(),
            prior,
        };
        out.next.sysctls.insert(key.clone(), managed);
        let current = drop_in_obs
            .text()
            .map(|(t, _)| parse_sysctl_conf(t))
            .unwrap_or_default();
        let lines_before = match was {
            Some((k, _)) => input
                .record
                .sysctl_drop_in_prior
                .get(k)
                .cloned()
                .unwrap_or_default(),
            None => drop_in_obs
                .text()
                .map(|(t, _)| line_values(t, key))
                .unwrap_or_default(),
        };
        if !lines_before.is_empty() {
            out.next
                .sysctl_drop_in_prior
                .insert(key.clone(), lines_before);
        }
        let live_ok = normalize(&live) == normalize(value);
        let persisted_ok =
            value_for(&current, key).map(|v| normalize(&v)) == Some(normalize(value));
        if live_ok && persisted_ok {
            return true;
        }
        if !live_ok {
            out.steps.effect(SetSysctl {
                key: key.clone(),
                value: value.clone(),
            });
        }
        out.push(ChangeBuilder {
            id,
            op: ChangeOperation::Update,
            before: live,
            after: value.clone(),
            covered: Ok("written live under /proc/sys and persisted in the sysctl.d drop-in"),
            disruption: none,
            targets,
        });
        true
    }

    /// Plans the keys dropped from the spec: their prior live value restored.
    fn dropped_keys(&self, input: &Input<'_>, out: &mut Output) {
        let drop_in = &input.config.sysctl.drop_in;
        for (key, m) in &input.record.sysctls {
            if desired_has(input.desired, key) {
                continue;
            }
            let live = input
                .obs
                .sysctls
                .live
                .get(key)
                .cloned()
                .flatten()
                .map(|l| l.value);
            if let (Some(prior), Some(l)) = (&m.prior, &live)
                && normalize(prior) != normalize(l)
            {
                out.steps.effect(SetSysctl {
                    key: key.clone(),
                    value: prior.clone(),
                });
            }
            out.push(ChangeBuilder {
                id: ChangeId::Sysctl(key.clone()).to_string(),
                op: ChangeOperation::Delete,
                before: live.unwrap_or_default(),
                after: m.prior.clone().unwrap_or_default(),
                covered: Ok("dropped from the spec: the prior live value is restored and the key leaves the drop-in"),
                disruption: disruption(DisruptionLevel::None, &[]),
                targets: vec![sysctl_path(key), drop_in.clone()],
            });
        }
    }

    /// Plans the section's own keys and its drop-in.
    fn own_keys(&self, input: &Input<'_>, out: &mut Output) {
        let drop_in = &input.config.sysctl.drop_in;
        let drop_in_obs = input.obs.sysctls.drop_in.clone().unwrap_or(TextObs::Absent);
        let mut drop_in_values = BTreeMap::new();
        for (key, value) in &input.desired.sysctls {
            if self.desired_key(input, out, &drop_in_obs, (key, value)) {
                drop_in_values.insert(key.clone(), value.clone());
            }
        }
        self.dropped_keys(input, out);
        // a dropped key whose line was in the drop-in before the agent set it gets that
        // line's value text back; the others lose the line the agent added
        let mut dropped = Vec::new();
        let mut restore = BTreeMap::new();
        for k in input.record.sysctls.keys() {
            if desired_has(input.desired, k) {
                continue;
            }
            match input.record.sysctl_drop_in_prior.get(k) {
                Some(lines) if !lines.is_empty() => {
                    restore.insert(k.clone(), lines.clone());
                }
                _ => dropped.push(k.clone()),
            }
        }
        let current_text = drop_in_obs.text().map(|(t, _)| t.to_string());
        match edit_sysctl_conf(current_text.as_deref(), &drop_in_values, &restore, &dropped) {
            None => {
                if current_text.is_some() && !input.record.sysctls.is_empty() {
                    out.steps.removes.push(Remove {
                        path: drop_in.clone(),
                        expect: drop_in_obs.fingerprint(),
                        dirs: Vec::new(),
                    });
                }
            }
            Some(edited) if current_text.as_deref() != Some(edited.as_str()) => {
                out.steps.writes.push(Write {
                    path: drop_in.clone(),
                    content: edited.into_bytes(),
                    mode: 0o644,
                    uid: 0,
                    gid: 0,
                    keep_meta: true,
                    expect: drop_in_obs.fingerprint(),
                    save_original: None,
                    managed_file: false,
                });
            }
            Some(_) => {}
        }
    }

    /// sysctl.d files written or removed by the steps so far (the `files` section) take
    /// effect live, as `systemd-sysctl` would apply them at boot (disruption none).
    fn files_live(&self, input: &Input<'_>, out: &mut Output) {
        let overrides = sysctl_overrides(input, out);
        let mut keys = BTreeSet::new();
        for (p, t) in &overrides {
            match t {
                Some(t) => keys.extend(parse_sysctl_conf(t).into_keys()),
                None => {
                    if let Some((_, t)) = input.obs.sysctls.files.iter().find(|(q, _)| q == p) {
                        keys.extend(parse_sysctl_conf(t).into_keys());
                    }
                }
            }
        }
        for key in keys {
            if input.desired.sysctls.contains_key(&key) {
                continue; // the sysctls section decides
            }
            let Some((value, from)) = boot_value(&input.obs.sysctls.files, &key, &overrides) else {
                continue; // no file sets it any more: the live value stays, as at boot
            };
            let id = out
                .changes
                .iter()
                .position(|c| c.id == ChangeId::File(from.clone()).to_string())
                .or_else(|| {
                    overrides.keys().find_map(|p| {
                        out.changes
                            .iter()
                            .position(|c| c.id == ChangeId::File(p.clone()).to_string())
                    })
                });
            apply_file_value(&input.obs.sysctls, out, id, (&key, &value));
        }
    }
}

/// The sysctl.d files the steps so far write (new text) or remove (None), other than the
/// agent's drop-in; a sysctl.d symlink whose target they write or remove counts as that.
fn sysctl_overrides(input: &Input<'_>, out: &Output) -> BTreeMap<String, Option<String>> {
    let drop_in = &input.config.sysctl.drop_in;
    let mut overrides: BTreeMap<String, Option<String>> = BTreeMap::new();
    for w in &out.steps.writes {
        if is_sysctl_conf(&w.path) && w.path != *drop_in {
            overrides.insert(
                w.path.clone(),
                Some(String::from_utf8_lossy(&w.content).into_owned()),
            );
        }
    }
    for r in &out.steps.removes {
        if is_sysctl_conf(&r.path) && r.path != *drop_in {
            overrides.insert(r.path.clone(), None);
        }
    }
    // a node symlink in sysctl.d reads what the steps write or remove at its target
    for (link, target) in &input.obs.sysctls.targets {
        if let Some(w) = out.steps.writes.iter().find(|w| w.path == *target) {
            let text = String::from_utf8_lossy(&w.content).into_owned();
            overrides.insert(link.clone(), Some(text));
        } else if out.steps.removes.iter().any(|r| r.path == *target) {
            overrides.insert(link.clone(), None);
        }
    }
    overrides
}

/// The live write of `key` = `value` that a sysctl.d file change brings, or why the
/// change at `id` is not covered.
fn apply_file_value(
    sysctls: &SysctlObs,
    out: &mut Output,
    id: Option<usize>,
    (key, value): (&str, &str),
) {
    match sysctls.live.get(key).cloned().flatten() {
        None => {
            if let Some(i) = id {
                out.changes[i].covered = false;
                out.changes[i].reason = format!(
                    "sets {key}, but {} does not exist on this node (unknown key, or its module is not loaded)",
                    sysctl_path(key)
                );
            }
        }
        Some(SysctlLive {
            unknown: Some(u), ..
        }) => {
            if let Some(i) = id {
                out.changes[i].covered = false;
                out.changes[i].reason = format!(
                    "sets {key}, but {u}: whether applying it live changes anything can not be told"
                );
            }
        }
        Some(live) if normalize(&live.value) != normalize(value) => {
            if !live.writable {
                if let Some(i) = id {
                    out.changes[i].covered = false;
                    out.changes[i].reason = format!("sets {key}, which is read-only");
                }
                return;
            }
            out.steps.effect(SetSysctl {
                key: key.to_string(),
                value: value.to_string(),
            });
            if let Some(i) = id
                && !out.changes[i].reason.contains("applied live")
            {
                out.changes[i]
                    .reason
                    .push_str("; its sysctls are applied live, as systemd-sysctl would at boot");
            }
        }
        Some(_) => {}
    }
}

impl Section for Sysctls {
    fn name(&self) -> &'static str {
        "sysctls"
    }

    /// Runs after the file machinery's observation: the originals about to be restored
    /// are read already.
    fn observe(&self, node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
        observe::read(node, obs)
    }

    fn reserved(&self, config: &Config, _obs: &Observed) -> Vec<(String, String)> {
        vec![(
            config.sysctl.drop_in.clone(),
            "the sysctls section".to_string(),
        )]
    }

    fn diff(&self, input: &Input<'_>, out: &mut Output) {
        if !input.desired.sysctls.is_empty() || !input.record.sysctls.is_empty() {
            self.own_keys(input, out);
        }
        self.files_live(input, out);
    }

    fn drift(&self, view: &DriftView<'_>) -> Vec<pb::Drift> {
        let mut out = Vec::new();
        let drop_in = &view.config.sysctl.drop_in;
        // the agent's own drop-in is a drift source too: what it holds is what boots
        let persisted = (!view.record.sysctls.is_empty())
            .then(|| view.root.read_string(drop_in))
            .map(|r| r.map(|t| t.map(|t| parse_sysctl_conf(&t))));
        for (key, m) in &view.record.sysctls {
            // unknown is not empty: an unreadable or empty value is shown as unknown
            let seen = observe_running(view.root, &sysctl_path(key)).map(|s| normalize(&s));
            let want = normalize(&m.value);
            let id = ChangeId::Sysctl(key.clone()).to_string();
            if seen.as_deref().ok() != Some(want.as_str()) {
                out.push(pb::Drift {
                    since: None,
                    id,
                    expected: want,
                    observed: seen.unwrap_or_else(|u| format!("unknown ({})", u.why)),
                });
                continue;
            }
            let observed = match &persisted {
                Some(Ok(Some(parsed))) => match value_for(parsed, key) {
                    Some(v) if normalize(&v) == want => continue,
                    Some(v) => format!(
                        "{} in {drop_in} (persisted for the next boot)",
                        normalize(&v)
                    ),
                    None => format!("not in {drop_in}: the value would not persist at boot"),
                },
                Some(Ok(None)) => {
                    format!("{drop_in} is deleted: the value would not persist at boot")
                }
                Some(Err(e)) => format!("unknown ({drop_in} can not be read: {e})"),
                None => continue,
            };
            out.push(pb::Drift {
                since: None,
                id,
                expected: format!("{want} (live and in {drop_in})"),
                observed,
            });
        }
        out
    }

    fn watched(&self, view: &DriftView<'_>) -> Vec<String> {
        if view.record.sysctls.is_empty() {
            Vec::new()
        } else {
            vec![view.config.sysctl.drop_in.clone()]
        }
    }
}
