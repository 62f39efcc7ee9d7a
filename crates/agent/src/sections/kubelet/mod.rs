//! The `kubelet` section: kubeadm's flags env file (`kubelet.flags[<name>]`) and the
//! KubeletConfiguration file (`kubelet.config.<path>`), both edited in place (every other
//! flag and field kept), then one kubelet restart. A change of the CPU, memory or
//! topology manager also resets the managers' checkpoints (a drain).
//!
//! Flags are planned first: a config field that a resulting flag overrides is not
//! covered (the kubelet lets a flag win over its config file), nor one that a later
//! `KUBELET_EXTRA_ARGS` shadows.

pub(crate) mod effects;
pub(crate) mod observe;
pub(crate) mod spec;
mod staying;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::config::Config;
use crate::sections::kit::change::{ChangeBuilder, disruption};
use crate::sections::kit::observe::{NodeView, ObserveError, TextObs};
use crate::sections::kit::steps::Write;
use crate::sections::kit::{DriftView, Input, Output, Section};
use crate::sections::model::Observed;
use crate::state::{ManagedField, ManagedValue};
use effects::{HealthGate, ResetCheckpoints};
use inplace_formats::kubelet::checkpoints::kubelet_state_files;
use inplace_formats::kubelet::config as kcfg;
use inplace_formats::kubelet::config::LeafEdit;
use inplace_formats::kubelet::fields as kcfg_fields;
use inplace_formats::kubelet::flags as kflags;
use inplace_formats::kubelet::flags::Flag;
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

/// The `kubelet` section.
#[derive(Debug)]
pub(crate) struct Kubelet;

/// Reason of a change that resets the kubelet's CPU or memory manager.
const RESET_REASON: &str = "changes the CPU, memory or topology manager: drain the node first; the kubelet is stopped, its manager checkpoint (/var/lib/kubelet/cpu_manager_state or memory_manager_state) removed, and started again, as the kubelet requires";

/// Change id of a KubeletConfiguration leaf: `kubelet.config.a.b`, with a segment that
/// holds `.`, `[` or `"` quoted (`kubelet.config.evictionHard["memory.available"]`), so ids
/// stay unique.
pub(crate) fn config_id(path: &[String]) -> String {
    ChangeId::KubeletConfig(path.to_vec()).to_string()
}

/// `Update` when the item exists, else `Create`.
fn upsert(exists: bool) -> ChangeOperation {
    if exists {
        ChangeOperation::Update
    } else {
        ChangeOperation::Create
    }
}

/// `Update` when a prior value is restored, `Delete` when there was none.
fn restore_op(prior_exists: bool) -> ChangeOperation {
    if prior_exists {
        ChangeOperation::Update
    } else {
        ChangeOperation::Delete
    }
}

fn json_summary(v: Option<&Value>) -> String {
    match v {
        None => "absent".into(),
        Some(v) => serde_json::to_string(v).unwrap_or_default(),
    }
}

/// The kubelet unit's disruptions: a restart, or a drain when checkpoints are reset;
/// and the checkpoint files the planned changes reset ([`effects::ResetCheckpoints`]).
struct Disruptions {
    restart: pb::Disruption,
    drain: pb::Disruption,
    resets: std::cell::RefCell<BTreeSet<String>>,
}

impl Disruptions {
    fn new(unit: &str) -> Self {
        Disruptions {
            restart: disruption(DisruptionLevel::Restart, &[unit]),
            drain: disruption(DisruptionLevel::Drain, &[unit]),
            resets: Default::default(),
        }
    }

    /// The checkpoint files `resets` are removed between the kubelet's stop and start.
    fn reset(&self, resets: &[String]) {
        self.resets.borrow_mut().extend(resets.iter().cloned());
    }

    fn of(&self, resets: &[String]) -> pb::Disruption {
        if resets.is_empty() {
            self.restart.clone()
        } else {
            self.drain.clone()
        }
    }
}

/// The last value of flag `name` on the command line `flags`.
fn last_value(flags: &[Flag], name: &str) -> Option<String> {
    flags
        .iter()
        .rev()
        .find(|f| f.name == name)
        .map(|f| f.value.clone().unwrap_or_default())
}

/// What the flags part decided, for the config part and the restart.
#[derive(Default)]
struct FlagPlan {
    /// Flags as they will be after the edit: name → value.
    final_flags: BTreeMap<String, Option<String>>,
    /// Flags to set and to remove.
    set: Vec<(String, String)>,
    remove: Vec<String>,
    restart: bool,
}

impl Kubelet {
    /// Plans the desired flags and the restore of dropped ones.
    fn flags(&self, input: &Input<'_>, out: &mut Output, d: &Disruptions) -> FlagPlan {
        let flags_path = &input.config.kubelet.flags_path;
        let mut fp = FlagPlan::default();
        let cur = match Self::current_flags(input) {
            Ok(cur) => cur,
            Err(e) => {
                for (name, value) in &input.desired.kubelet.flags {
                    out.push(ChangeBuilder {
                        id: ChangeId::KubeletFlag(name.to_string()).to_string(),
                        op: ChangeOperation::Update,
                        before: String::new(),
                        after: value.clone(),
                        covered: Err(e.clone()),
                        disruption: d.restart.clone(),
                        targets: vec![flags_path.clone()],
                    });
                }
                return fp;
            }
        };
        for f in &cur {
            fp.final_flags.insert(f.name.clone(), f.value.clone());
        }
        for (name, value) in &input.desired.kubelet.flags {
            self.desired_flag(input, out, d, &cur, (name, value), &mut fp);
        }
        for (name, m) in &input.record.kubelet_flags {
            if input.desired.kubelet.flags.contains_key(name) {
                continue;
            }
            let now = last_value(&cur, name);
            let want = m.prior.clone();
            if now == want {
                continue;
            }
            match &want {
                Some(v) => {
                    fp.set.push((name.clone(), v.clone()));
                    fp.final_flags.insert(name.clone(), Some(v.clone()));
                }
                None => {
                    fp.remove.push(name.clone());
                    fp.final_flags.remove(name);
                }
            }
            fp.restart = true;
            let resets = kubelet_state_files(&[name.as_str()], true);
            d.reset(&resets);
            let mut reason = String::from("dropped from the spec: the prior value is restored");
            if now.as_deref() != Some(m.value.as_str()) {
                reason.push_str(&format!(
                    " (the node has {}, not the {} inplaced set: another writer changed it)",
                    now.clone().unwrap_or_else(|| "no value".into()),
                    m.value
                ));
            }
            reason.push_str("; kubelet restart");
            reason.extend(staying::flag(input, name));
            out.push(ChangeBuilder {
                id: ChangeId::KubeletFlag(name.to_string()).to_string(),
                op: restore_op(want.is_some()),
                before: now.unwrap_or_else(|| "absent".into()),
                after: want.unwrap_or_else(|| "absent".into()),
                covered: Ok(&reason),
                disruption: d.of(&resets),
                targets: vec![flags_path.clone()],
            });
        }
        fp
    }

    /// kubeadm's flags as the node has them.
    fn current_flags(input: &Input<'_>) -> Result<Vec<Flag>, String> {
        let flags_path = &input.config.kubelet.flags_path;
        match &input.obs.kubelet.flags {
            TextObs::Problem(p) => Err(p.clone()),
            obs => kflags::parse(
                obs.text().map(|(t, _)| t).unwrap_or(""),
                "KUBELET_KUBEADM_ARGS",
            )
            .map(Option::unwrap_or_default)
            .map_err(|e| format!("{flags_path}: {e}")),
        }
    }

    /// Plans one desired flag: recorded with its prior value, and a change unless the
    /// node has it and nothing overrides it.
    fn desired_flag(
        &self,
        input: &Input<'_>,
        out: &mut Output,
        d: &Disruptions,
        cur: &[Flag],
        (name, value): (&String, &String),
        fp: &mut FlagPlan,
    ) {
        let now = last_value(cur, name);
        let prior = match input.record.kubelet_flags.get(name) {
            Some(m) => m.prior.clone(),
            None => now.clone(),
        };
        out.next.kubelet_flags.insert(
            name.clone(),
            ManagedValue {
                value: value.clone(),
                prior,
            },
        );
        fp.final_flags.insert(name.clone(), Some(value.clone()));
        let kubelet = &input.obs.kubelet;
        // the last value of the flag after kubeadm's on the command line wins
        let shadow = kubelet
            .extra_args
            .iter()
            .enumerate()
            .filter(|(i, _)| !kubelet.before_kubeadm.contains(i))
            .flat_map(|(_, e)| e.flags.iter().map(move |f| (e, f)))
            .rfind(|(_, f)| &f.name == name)
            .filter(|(_, f)| f.value.as_deref() != Some(value.as_str()))
            .map(|(e, f)| (e.place(), f.value.clone().unwrap_or_default()));
        let in_unit = unit_shadow(input, name, value);
        if now.as_deref() == Some(value.as_str()) && shadow.is_none() && in_unit.is_none() {
            return;
        }
        let unreadable = kubelet.problems.first().map(|p| {
            format!("cannot check KUBELET_EXTRA_ARGS, which overrides kubeadm-flags.env: {p}")
        });
        let resets = kubelet_state_files(&[name.as_str()], true);
        let covered = match (&shadow, &unreadable) {
            (_, Some(p)) => Err(p.clone()),
            _ if in_unit.is_some() => Err(in_unit.unwrap_or_default()),
            (Some((p, v)), None) => Err(format!(
                "--{name}={v} in {p} comes later on the kubelet command line and overrides kubeadm-flags.env; change or remove it there"
            )),
            (None, None) => Ok(if resets.is_empty() {
                "kubeadm-flags.env edited, other flags kept in order; kubelet restart"
            } else {
                RESET_REASON
            }),
        };
        if covered.is_ok() {
            fp.set.push((name.clone(), value.clone()));
            fp.restart = true;
            d.reset(&resets);
        }
        out.push(ChangeBuilder {
            id: ChangeId::KubeletFlag(name.to_string()).to_string(),
            op: upsert(now.is_some()),
            before: now.unwrap_or_else(|| "absent".into()),
            after: value.clone(),
            covered,
            disruption: d.of(&resets),
            targets: vec![input.config.kubelet.flags_path.clone()],
        });
    }

    /// The edited flags file, when a flag is set or removed.
    fn write_flags(&self, input: &Input<'_>, out: &mut Output, fp: &FlagPlan) {
        if fp.set.is_empty() && fp.remove.is_empty() {
            return;
        }
        let flags_path = &input.config.kubelet.flags_path;
        let obs = &input.obs.kubelet.flags;
        let (text, entry) = match obs.text() {
            Some((t, e)) => (t, Some(e)),
            None => ("", None),
        };
        match kflags::edit(text, "KUBELET_KUBEADM_ARGS", &fp.set, &fp.remove) {
            // nothing left of a file the agent created (its marker and line went): the
            // file goes too, as it was absent (the unit reads it with `EnvironmentFile=-`)
            Ok(text) if text.is_empty() && entry.is_some() => {
                out.steps.removes.push(crate::sections::kit::steps::Remove {
                    path: flags_path.clone(),
                    expect: obs.fingerprint(),
                    dirs: Vec::new(),
                });
            }
            Ok(text) => out.steps.writes.push(Write {
                path: flags_path.clone(),
                content: text.into_bytes(),
                mode: 0o644,
                uid: 0,
                gid: 0,
                keep_meta: entry.is_some(),
                expect: obs.fingerprint(),
                save_original: None,
                managed_file: false,
            }),
            Err(e) => out.fail_all("kubelet.flags[", &format!("{flags_path}: {e}")),
        }
    }
}

/// The parsed KubeletConfiguration file: its parse (text and document), metadata and
/// value.
type Parsed<'a> = Result<(&'a kcfg::Document, inplace_node::sysroot::Entry, &'a Value), String>;

/// The config part's edits, with the ids of their changes.
#[derive(Default)]
struct ConfigEdits {
    edits: Vec<LeafEdit>,
    ids: Vec<String>,
}

impl Kubelet {
    /// Plans the desired config fields and the restore of dropped ones; true when the
    /// file is written (a kubelet restart).
    fn config(
        &self,
        input: &Input<'_>,
        out: &mut Output,
        d: &Disruptions,
        final_flags: &BTreeMap<String, Option<String>>,
    ) -> bool {
        let cfg_path = &input.config.kubelet.config_path;
        let desired_leaves = input
            .desired
            .kubelet
            .config
            .as_ref()
            .map(|m| kcfg::leaves(&Value::Object(m.clone())))
            .unwrap_or_default();
        if desired_leaves.is_empty() && input.record.kubelet_config.is_empty() {
            return false;
        }
        // the file parsed once, kept by the observation while the file stays the same
        // (issue 28); parsed here when the observation has no parse of this very text
        let fresh;
        let parsed: Parsed = match &input.obs.kubelet.config {
            TextObs::Absent => Err(format!(
                "no KubeletConfiguration file at {cfg_path}; set kubelet.config_path in the agent config if the kubelet reads another file"
            )),
            TextObs::Problem(p) => Err(p.clone()),
            TextObs::Text(text, entry) => {
                let doc = match &input.obs.kubelet.config_doc {
                    Some(d) if d.text() == text => &**d,
                    _ => {
                        fresh = kcfg::Document::parse(text.clone());
                        &fresh
                    }
                };
                doc.value()
                    .map(|v| (doc, *entry, v))
                    .map_err(|e| format!("{cfg_path}: {e}"))
            }
        };
        let mut ce = ConfigEdits::default();
        // the fields' source texts with the one parse of the file (one per field was O(N²))
        let raws = match &parsed {
            Ok((doc, _, _)) => doc.raw_scalars(desired_leaves.iter().map(|(p, _)| &p[..])),
            Err(_) => vec![None; desired_leaves.len()],
        };
        for ((path, value), raw) in desired_leaves.iter().zip(raws) {
            self.desired_field(
                input,
                out,
                d,
                &parsed,
                (path, value, raw),
                final_flags,
                &mut ce,
            );
        }
        let Ok((text, entry, doc)) = parsed else {
            return false;
        };
        for (id, m) in &input.record.kubelet_config {
            if desired_leaves.iter().any(|(p, _)| p == &m.path) {
                continue;
            }
            let now = kcfg::get(doc, &m.path).cloned();
            if now == m.value.prior {
                continue;
            }
            ce.edits.push(match (&m.value.prior, &m.prior_raw) {
                (Some(v), Some(raw)) => LeafEdit::SetRaw(m.path.clone(), v.clone(), raw.clone()),
                (Some(v), None) => LeafEdit::Set(m.path.clone(), v.clone()),
                (None, _) => LeafEdit::Remove(m.path.clone()),
            });
            ce.ids.push(id.clone());
            let resets = kubelet_state_files(&[m.path[0].as_str()], false);
            d.reset(&resets);
            let mut reason =
                String::from("dropped from the spec: the prior value is restored; kubelet restart");
            reason.extend(staying::field(input, &m.path, final_flags));
            out.push(ChangeBuilder {
                id: id.clone(),
                op: restore_op(m.value.prior.is_some()),
                before: json_summary(now.as_ref()),
                after: json_summary(m.value.prior.as_ref()),
                covered: Ok(&reason),
                disruption: d.of(&resets),
                targets: vec![cfg_path.clone()],
            });
        }
        if ce.edits.is_empty() {
            return false;
        }
        self.write_config(input, out, d, (text, &entry), &ce)
    }

    /// Plans one desired config field: recorded with its prior value (when the file
    /// parses), and a change unless the file has it.
    #[allow(clippy::too_many_arguments)]
    fn desired_field(
        &self,
        input: &Input<'_>,
        out: &mut Output,
        d: &Disruptions,
        parsed: &Parsed,
        (path, value, raw): (&Vec<String>, &Value, Option<String>),
        final_flags: &BTreeMap<String, Option<String>>,
        ce: &mut ConfigEdits,
    ) {
        let id = config_id(path);
        let now = match parsed {
            Ok((_, _, doc)) => kcfg::get(doc, path).cloned(),
            Err(_) => None,
        };
        if parsed.is_ok() {
            let (prior, prior_raw) = match (input.record.kubelet_config.get(&id), parsed) {
                (Some(m), _) => (m.value.prior.clone(), m.prior_raw.clone()),
                (None, Ok(_)) => (now.clone(), raw),
                (None, Err(_)) => (now.clone(), None),
            };
            out.next.kubelet_config.insert(
                id.clone(),
                ManagedField {
                    prior_raw,
                    path: path.clone(),
                    value: ManagedValue {
                        value: value.clone(),
                        prior,
                    },
                },
            );
            if now.as_ref() == Some(value) {
                return;
            }
        }
        let resets = kubelet_state_files(&[path[0].as_str()], false);
        let covered = match (parsed, config_field_problem(input, path, final_flags)) {
            (Err(e), _) => Err(e.clone()),
            (_, Some(s)) => Err(s),
            _ => {
                ce.edits.push(LeafEdit::Set(path.clone(), value.clone()));
                ce.ids.push(id.clone());
                d.reset(&resets);
                Ok(if resets.is_empty() {
                    "merged into the KubeletConfiguration file, every other field kept; kubelet restart"
                } else {
                    RESET_REASON
                })
            }
        };
        out.push(ChangeBuilder {
            id,
            op: upsert(now.is_some()),
            before: json_summary(now.as_ref()),
            after: json_summary(Some(value)),
            covered,
            disruption: d.of(&resets),
            targets: vec![input.config.kubelet.config_path.clone()],
        });
    }

    /// The edited config file; when the edit can not keep the file's layout, the edited
    /// fields are not covered and nothing is written.
    fn write_config(
        &self,
        input: &Input<'_>,
        out: &mut Output,
        d: &Disruptions,
        (doc, entry): (&kcfg::Document, &inplace_node::sysroot::Entry),
        ce: &ConfigEdits,
    ) -> bool {
        let cfg_path = &input.config.kubelet.config_path;
        match doc.edit(&ce.edits) {
            Ok(edited) if edited.faithful => {
                out.steps.writes.push(Write {
                    path: cfg_path.clone(),
                    content: edited.text.into_bytes(),
                    mode: entry.mode,
                    uid: entry.uid,
                    gid: entry.gid,
                    keep_meta: true,
                    expect: input.obs.kubelet.config.fingerprint(),
                    save_original: None,
                    managed_file: false,
                });
                true
            }
            Ok(_) => {
                let reason = format!(
                    "{cfg_path} uses YAML that can not be edited in place at this field (flow style, anchors, tags or block scalars); inplaced would have to re-render the whole file and lose its comments and layout: write the field in block style, or manage the file under files"
                );
                for c in out.changes.iter_mut().filter(|c| ce.ids.contains(&c.id)) {
                    c.covered = false;
                    c.reason = reason.clone();
                }
                d.resets.borrow_mut().clear();
                false
            }
            Err(e) => {
                out.fail_all("kubelet.config", &format!("{cfg_path}: {e}"));
                false
            }
        }
    }
}

/// The kubeadm flags file's variable on the kubelet's command line.
const KUBEADM_VAR: &str = "KUBELET_KUBEADM_ARGS";

/// Flag `name` written literally in the kubelet unit's effective `ExecStart=` (a systemd
/// unit drop-in, `kubelet.service.d/*.conf`, may set one): (the file, its value). With
/// `after_kubeadm`, only one after `$KUBELET_KUBEADM_ARGS` (it wins over kubeadm-flags.env,
/// the last value of a flag wins), or any when the command line does not pass the
/// variable at all (then kubeadm-flags.env is not read and the literal is what runs).
fn unit_literal(input: &Input<'_>, name: &str, after_kubeadm: bool) -> Option<(String, String)> {
    let (file, words) = input.obs.kubelet.exec_start.as_ref()?;
    let from = if after_kubeadm {
        words
            .iter()
            .position(|w| w.contains(KUBEADM_VAR))
            .unwrap_or(0)
    } else {
        0
    };
    words[from..].iter().enumerate().rev().find_map(|(i, w)| {
        let body = w.strip_prefix("--")?;
        match body.split_once('=') {
            Some((n, v)) if n == name => Some((file.clone(), v.to_string())),
            None if body == name => {
                let v = words
                    .get(from + i + 1)
                    .filter(|n| !n.starts_with('-') && !n.starts_with('$'));
                Some((file.clone(), v.cloned().unwrap_or_default()))
            }
            _ => None,
        }
    })
}

/// Why a desired flag written to kubeadm-flags.env would not be what the kubelet runs
/// with, from the unit's effective `ExecStart=`: the command line does not pass
/// `$KUBELET_KUBEADM_ARGS`, or sets the flag literally after it.
fn unit_shadow(input: &Input<'_>, name: &str, value: &str) -> Option<String> {
    if let Some(why) = &input.obs.kubelet.kubeadm_source {
        return Some(why.clone());
    }
    let (file, words) = input.obs.kubelet.exec_start.as_ref()?;
    if !words.iter().any(|w| w.contains(KUBEADM_VAR)) {
        return Some(format!(
            "the kubelet's effective ExecStart in {file} does not pass ${KUBEADM_VAR}, so {} is not read; change the unit there",
            input.config.kubelet.flags_path
        ));
    }
    let (file, v) = unit_literal(input, name, true)?;
    (v != value).then(|| {
        format!(
            "--{name}={v} in the effective ExecStart of {file} comes after ${KUBEADM_VAR} on the kubelet command line and overrides kubeadm-flags.env; change or remove it there"
        )
    })
}

/// The last `--config-dir` drop-in that sets the field at `path` (or a field above it):
/// the kubelet merges the drop-ins over the config file, so an edit of the file would not
/// change what the kubelet runs with.
fn dropin_override(input: &Input<'_>, path: &[String]) -> Option<String> {
    if let Some(p) = input.obs.kubelet.dropin_problems.first() {
        return Some(format!(
            "cannot check the kubelet's --config-dir drop-ins, which override {}: {p}",
            input.config.kubelet.config_path
        ));
    }
    let (file, _) = input
        .obs
        .kubelet
        .config_dropins
        .iter()
        .rev()
        .find(|(_, doc)| {
            (1..=path.len()).any(|n| {
                kcfg::get(doc, &path[..n]).is_some_and(|v| n == path.len() || !v.is_object())
            })
        })?;
    let named = match input.desired.files.iter().any(|f| &f.path == file) {
        true => format!(
            "{file} (written by {} in this spec)",
            ChangeId::File(file.clone())
        ),
        false => file.clone(),
    };
    Some(format!(
        "KubeletConfiguration drop-in {named} (kubelet --config-dir) sets {}, and the kubelet merges its drop-ins over {} (a later drop-in wins): the value stays {file}'s; change it there",
        path.join("."),
        input.config.kubelet.config_path
    ))
}

/// Why the kubelet does not read the managed KubeletConfiguration file: its `--config`
/// (the last one on the command line: a variable the unit's environment sets, such as
/// kubeadm's `KUBELET_CONFIG_ARGS`, or a literal of the effective `ExecStart=`) names
/// another file.
fn other_config_file(input: &Input<'_>) -> Option<String> {
    let cfg = &input.config.kubelet.config_path;
    let k = &input.obs.kubelet;
    let from_env = k.extra_args.iter().rev().find_map(|e| {
        let f = e.flags.iter().rev().find(|f| f.name == "config")?;
        Some((f.value.clone().unwrap_or_default(), e.place()))
    });
    let (v, place) = from_env.or_else(|| {
        unit_literal(input, "config", false)
            .map(|(file, v)| (v, format!("the effective ExecStart of {file}")))
    })?;
    (v != *cfg).then(|| {
        format!(
            "the kubelet reads --config={v} (in {place}), not {cfg}, so an edit of {cfg} would not change what it runs with; set kubelet.config_path in the agent config to {v}, or change it there"
        )
    })
}

/// Why a KubeletConfiguration field can not be merged: unknown to the kubelet, or
/// overridden by a flag (flags win over the config file).
fn config_field_problem(
    input: &Input<'_>,
    path: &[String],
    final_flags: &BTreeMap<String, Option<String>>,
) -> Option<String> {
    let top = path[0].as_str();
    if !kcfg_fields::is_known(top) {
        return Some(kcfg_fields::unknown_field_message(top));
    }
    if let Some(p) = other_config_file(input) {
        return Some(p);
    }
    if let Some(p) = dropin_override(input, path) {
        return Some(p);
    }
    let flag = kcfg_fields::flag_for(path)?;
    if let Some(v) = final_flags.get(&flag) {
        return Some(format!(
            "kubelet flag --{flag}={} in {} overrides KubeletConfiguration field {}; manage it under kubelet.flags instead",
            v.clone().unwrap_or_default(),
            input.config.kubelet.flags_path,
            path.join(".")
        ));
    }
    if let Some((file, v)) = unit_literal(input, &flag, false) {
        return Some(format!(
            "kubelet flag --{flag}={v} in the effective ExecStart of {file} overrides KubeletConfiguration field {}; change it there",
            path.join(".")
        ));
    }
    input.obs.kubelet.extra_args.iter().rev().find_map(|e| {
        e.flags.iter().rev().find(|f| f.name == flag).map(|f| {
            format!(
                "kubelet flag --{flag}={} in {} overrides KubeletConfiguration field {}; change it there",
                f.value.clone().unwrap_or_default(),
                e.place(),
                path.join(".")
            )
        })
    })
}

impl Section for Kubelet {
    fn name(&self) -> &'static str {
        "kubelet"
    }

    fn observe(&self, node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
        observe::read(node, obs)
    }

    fn reserved(&self, config: &Config, _obs: &Observed) -> Vec<(String, String)> {
        vec![
            (
                config.kubelet.config_path.clone(),
                "the kubelet.config section".to_string(),
            ),
            (
                config.kubelet.flags_path.clone(),
                "the kubelet.flags section".to_string(),
            ),
        ]
    }

    fn diff(&self, input: &Input<'_>, out: &mut Output) {
        let unit = &input.config.kubelet.unit;
        let d = Disruptions::new(unit);
        // flags first: config fields check the resulting flags for shadowing
        let fp = self.flags(input, out, &d);
        self.write_flags(input, out, &fp);
        let config_written = self.config(input, out, &d, &fp.final_flags);
        if fp.restart || config_written {
            out.steps.restarts.insert(unit.clone());
        }
        let files = d.resets.take();
        if !files.is_empty() {
            out.steps.effect(ResetCheckpoints {
                unit: unit.clone(),
                files,
            });
        }
        // a restart of the kubelet by any section (a files item's disruption too) is
        // gated by its health, unless a reboot absorbs it
        if out.steps.restarts.contains(unit) {
            out.steps.effect(HealthGate);
        }
    }

    fn drift(&self, view: &DriftView<'_>) -> Vec<pb::Drift> {
        let mut out = config_drift(view);
        out.extend(flags_drift(view));
        out
    }

    fn watched(&self, view: &DriftView<'_>) -> Vec<String> {
        let r = view.record;
        if r.kubelet_config.is_empty() && r.kubelet_flags.is_empty() {
            return Vec::new();
        }
        let k = &view.config.kubelet;
        vec![k.config_path.clone(), k.flags_path.clone()]
    }
}

/// Recorded config fields whose value in the file is not the one applied.
fn config_drift(view: &DriftView<'_>) -> Vec<pb::Drift> {
    let mut out = Vec::new();
    if !view.record.kubelet_config.is_empty()
        && let Ok(Some(text)) = view.root.read_string(&view.config.kubelet.config_path)
        && let Ok(doc) = kcfg::parse(&text)
    {
        for (id, f) in &view.record.kubelet_config {
            let seen = kcfg::get(&doc, &f.path).cloned();
            if seen.as_ref() != Some(&f.value.value) {
                out.push(pb::Drift {
                    since: None,
                    id: id.clone(),
                    expected: f.value.value.to_string(),
                    observed: seen
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "absent".into()),
                });
            }
        }
    }
    out
}

/// Recorded flags whose value in kubeadm's flags file is not the one applied.
fn flags_drift(view: &DriftView<'_>) -> Vec<pb::Drift> {
    let mut out = Vec::new();
    if view.record.kubelet_flags.is_empty() {
        return out;
    }
    let text = view
        .root
        .read_string(&view.config.kubelet.flags_path)
        .ok()
        .flatten()
        .unwrap_or_default();
    let flags = kflags::parse(&text, "KUBELET_KUBEADM_ARGS")
        .ok()
        .flatten()
        .unwrap_or_default();
    for (name, m) in &view.record.kubelet_flags {
        let seen = last_value(&flags, name);
        if seen.as_deref() != Some(m.value.as_str()) {
            out.push(pb::Drift {
                since: None,
                id: ChangeId::KubeletFlag(name.to_string()).to_string(),
                expected: m.value.clone(),
                observed: seen.unwrap_or_else(|| "absent".into()),
            });
        }
    }
    out
}
