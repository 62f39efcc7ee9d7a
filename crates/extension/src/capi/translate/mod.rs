//! KubeadmConfig (and Machine / InfraMachine) specs → NodeSpec, unit by unit.
//!
//! The spec of a KubeadmConfig (`bootstrap.cluster.x-k8s.io/v1beta2`, the only version
//! CAPI sends: see [`kubeadm_api_version_problem`]) is read as raw JSON. Every difference
//! between current and desired becomes a [`DiffUnit`]: the JSON location CAPI's patch
//! would copy (lists are atomic, so `spec.files` is one unit), the node changes it needs
//! (agent change ids such as `files[/etc/x]`, `kubelet.flags[max-pods]`, `ntp`), or the
//! reason it can not be applied in place at all. The NodeSpec sent to the node holds
//! only what the KubeadmConfig says, decoded the way cloud-init's `write_files` would.
//!
//! Rules beyond cloud-init's:
//! - Values holding cloud-init Jinja (`{{ ds.meta_data.uuid }}`) are rendered on the node
//!   only: they are never sent to the agent, and a change to one is not covered.
//! - Removing a file or a kubelet argument is not covered: kubeadm and cloud-init only
//!   ever add them, and the node would keep the old one.
//! - `joinConfiguration.discovery` and `initConfiguration.bootstrapTokens` (bootstrap
//!   tokens) are never read: see [`redact`].
//! - Every member of a changed unit is understood or blocks the unit: a member the
//!   translation does not read (a `files[]` or `kubeletExtraArgs[]` entry's, `ntp`'s),
//!   on either side of a changed entry, makes the unit not covered with its JSON pointer
//!   ([`unknown_members`]); copying the list verbatim would pass CAPI's comparison although
//!   the node never acts on it. An entry identical on both sides needs no node action,
//!   whatever it holds, and UpdateMachine leaves an entry with unknown members out of the
//!   NodeSpec (a skipped note) rather than apply a reading of it that may be wrong.
//! - A file at `/etc/inplaced/node.d/<name>.yaml` is a NodeSpec drop-in: it is sent as a
//!   [`pb::DropIn`], which the agent parses and merges (see README, "NodeSpec drop-ins").
//!
//! Map, by NodeSpec section (the CAPI-side mirror of the agent's sections): `files`
//! (files and drop-ins), `kubelet_args` (`kubeletExtraArgs`), `ntp`, `version` (the
//! Machine's Kubernetes version); `decode` (base64 and gzip content within the decoded
//! budget), `redact` (secrets out before anything else), `schema` (what the translation
//! knows of v1beta2). This module: the units ([`DiffUnit`], [`Analysis`]), the generic
//! JSON diff, the KubeadmConfig analysis ([`kubeadm`]), the NodeSpec assembly
//! ([`node_spec`]) and the Machine and InfraMachine diffs.

use std::collections::BTreeSet;

use serde_json::Value;

use super::patch::{Unit, get};

mod decode;
mod files;
mod kubelet_args;
mod ntp;
mod redact;
mod schema;
#[cfg(test)]
mod tests;
mod version;

pub use decode::{
    DecodeBudget, MAX_DECODED_CONFIG_BYTES, MAX_DECODED_FILE_BYTES, NodeFile, decode_file,
    decode_file_within, over_config_budget,
};
use inplace_wire::pb;
pub use kubelet_args::kubelet_args_of;
pub use redact::redact;
pub use schema::{
    ARG_FIELDS, FILE_FIELDS, KUBEADM_API_VERSION, NTP_FIELDS, kubeadm_api_version_problem,
    unknown_members,
};
pub use version::{VERSION_ID, version_delta};

/// One difference between current and desired, and whether it can be applied in place.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffUnit {
    /// The location CAPI's patch copies from desired when the unit is covered.
    pub unit: Unit,
    /// Dotted path for messages (`spec.diskSetup`, `spec.files`).
    pub path: String,
    /// Not covered whatever the node says, with the reason.
    pub blocked: Option<String>,
    /// Agent change ids this unit needs; all must be covered. Empty = no node change.
    pub ids: Vec<String>,
    /// Also answers for agent change ids no unit names (the items of a drop-in).
    pub claims_unknown: bool,
}

impl DiffUnit {
    /// A unit copied whole at `tokens`, not blocked, needing no node change (yet).
    pub fn open(tokens: &[String]) -> DiffUnit {
        DiffUnit {
            path: dotted(tokens),
            unit: Unit::whole(tokens),
            blocked: None,
            ids: vec![],
            claims_unknown: false,
        }
    }

    fn blocked(tokens: &[String], reason: impl Into<String>) -> DiffUnit {
        DiffUnit {
            blocked: Some(reason.into()),
            ..DiffUnit::open(tokens)
        }
    }
}

/// The differences of one object pair and the node changes they need.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Analysis {
    /// Differing units, in spec order.
    pub units: Vec<DiffUnit>,
    /// The changed node items (what the node's coverage is asked about).
    pub delta: pb::NodeSpec,
}

fn dotted(tokens: &[String]) -> String {
    let mut s = String::new();
    for t in tokens {
        if t.parse::<usize>().is_ok() {
            s.push_str(&format!("[{t}]"));
        } else {
            if !s.is_empty() {
                s.push('.');
            }
            s.push_str(t);
        }
    }
    s
}

fn toks(root: &[&str], rest: &[&str]) -> Vec<String> {
    root.iter().chain(rest).map(|s| s.to_string()).collect()
}

/// True if `s` holds cloud-init Jinja, which only the node can render.
pub fn has_jinja(s: &str) -> bool {
    s.contains("{{") || s.contains("{%")
}

/// Why a top-level KubeadmConfigSpec field is never applied in place.
fn field_reason(field: &str) -> &'static str {
    match field {
        "diskSetup" => "partitioning and formatting are destructive and never applied in place",
        "mounts" => {
            "mounts are set up by cloud-init at provisioning; changing them in place is not supported"
        }
        "format" | "ignition" => {
            "changes how the machine is provisioned (bootstrap format), which only a new machine can use"
        }
        "bootCommands" => {
            "boot commands are arbitrary commands run by cloud-init; inplaced does not run them"
        }
        "preKubeadmCommands" | "postKubeadmCommands" => {
            "commands that ran once around kubeadm join; inplaced does not re-run arbitrary commands"
        }
        "users" => "users and SSH keys are not applied in place yet",
        "clusterConfiguration" => {
            "control-plane and cluster settings are applied by kubeadm (init/upgrade), not by inplaced"
        }
        "initConfiguration" => "kubeadm reads it only at init",
        "joinConfiguration" => {
            "kubeadm reads it only at join; a running node keeps what join set up"
        }
        _ => "no in-place handler for this field",
    }
}

/// The differing locations under `tokens` (objects recurse; anything else is one unit).
fn diff_paths(
    c: Option<&Value>,
    d: Option<&Value>,
    tokens: &mut Vec<String>,
    out: &mut Vec<Vec<String>>,
) {
    match (c, d) {
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            // Keep spec order: desired's keys first, then current-only ones.
            let mut ordered: Vec<&String> = b.keys().collect();
            ordered.extend(a.keys().filter(|k| !b.contains_key(*k)));
            debug_assert_eq!(ordered.len(), keys.len());
            for k in ordered {
                tokens.push(k.clone());
                diff_paths(a.get(k), b.get(k), tokens, out);
                tokens.pop();
            }
        }
        (a, b) if a == b => {}
        _ => out.push(tokens.clone()),
    }
}

/// Analyses a KubeadmConfig spec pair rooted at `root` (`["spec"]`, or
/// `["spec","template","spec"]` for a KubeadmConfigTemplate), both at
/// [`KUBEADM_API_VERSION`].
pub fn kubeadm(current: &Value, desired: &Value, root: &[&str]) -> Analysis {
    let mut out = Analysis::default();
    let cs = get(current, root);
    let ds = get(desired, root);
    // Units with handlers; everything else differing is blocked by field.
    let handled: [&[&str]; 4] = [
        &["files"],
        &["joinConfiguration", "nodeRegistration", "kubeletExtraArgs"],
        &["ntp"],
        &["verbosity"],
    ];
    let mut paths = Vec::new();
    diff_paths(
        cs,
        ds,
        &mut root.iter().map(|s| s.to_string()).collect(),
        &mut paths,
    );
    let mut seen_handled = BTreeSet::new();
    let mut blocked_top = BTreeSet::new();
    for p in paths {
        let rel: Vec<&str> = p[root.len()..].iter().map(String::as_str).collect();
        if let Some(h) = handled.iter().find(|h| rel.starts_with(h)) {
            if seen_handled.insert(h.to_vec()) {
                match h[0] {
                    "files" => files::files(current, desired, root, &mut out),
                    "ntp" => ntp::ntp(current, desired, root, &mut out),
                    "verbosity" => out.units.push(DiffUnit::open(&toks(root, h))),
                    _ => kubelet_args::kubelet_args(current, desired, root, &mut out),
                }
            }
            continue;
        }
        let Some(top) = rel.first() else {
            out.units.push(DiffUnit::blocked(
                &p,
                "the bootstrap config spec was added or removed",
            ));
            continue;
        };
        // Whole-field reasons for top-level fields; join/init/cluster configuration are
        // reported at the deepest differing member so the message is precise.
        if matches!(
            *top,
            "joinConfiguration" | "initConfiguration" | "clusterConfiguration"
        ) {
            out.units.push(DiffUnit::blocked(&p, field_reason(top)));
        } else if blocked_top.insert(top.to_string()) {
            out.units
                .push(DiffUnit::blocked(&toks(root, &[top]), field_reason(top)));
        }
    }
    out
}

fn str_of<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

/// The full NodeSpec a desired KubeadmConfig asks for (for UpdateMachine, which has no
/// current): every file and kubelet argument and ntp, minus what only the node can render
/// (Jinja) or what was never in-place material (append, contentFrom, Template). Those are
/// returned as skipped notes; CanUpdate already refused any change to them.
pub fn node_spec(desired: &Value, root: &[&str]) -> (pb::NodeSpec, Vec<String>) {
    let (spec, skipped, _) = node_spec_within(desired, root);
    (spec, skipped)
}

/// [`node_spec`], or [`over_config_budget`] when the files decode to more than
/// [`MAX_DECODED_CONFIG_BYTES`] together (UpdateMachine refuses such a spec rather than
/// apply it without some of its files).
pub fn node_spec_checked(
    desired: &Value,
    root: &[&str],
) -> Result<(pb::NodeSpec, Vec<String>), String> {
    match node_spec_within(desired, root) {
        (_, _, true) => Err(over_config_budget()),
        (spec, skipped, false) => Ok((spec, skipped)),
    }
}

/// [`node_spec`] and whether the files went over [`MAX_DECODED_CONFIG_BYTES`]: each
/// section's desired part in turn.
fn node_spec_within(desired: &Value, root: &[&str]) -> (pb::NodeSpec, Vec<String>, bool) {
    let mut spec = pb::NodeSpec::default();
    let mut skipped = Vec::new();
    let exceeded = files::desired_files(desired, root, &mut spec, &mut skipped);
    spec.kubelet = kubelet_args::desired_flags(desired, root, &mut skipped);
    spec.ntp = ntp::desired_ntp(desired, root, &mut skipped);
    (spec, skipped, exceeded)
}

/// Machine spec fields CAPI zeroes before comparing (`CleanupMachineSpecForDiff`).
const MACHINE_IGNORED: [&str; 8] = [
    "clusterName",
    "bootstrap",
    "infrastructureRef",
    "providerID",
    "minReadySeconds",
    "readinessGates",
    "deletion",
    "taints",
];

/// Differences of a Machine spec (`root` = `["spec"]`) or a MachineSet's machine
/// template (`["spec","template","spec"]`), after CAPI's clean-up. Only `version` can be
/// applied in place (see `version::version_unit`); the others are blocked.
pub fn machine(current: &Value, desired: &Value, root: &[&str]) -> Vec<DiffUnit> {
    let clean = |v: &Value| {
        let mut s = get(v, root).cloned().unwrap_or(Value::Null);
        if let Some(m) = s.as_object_mut() {
            for k in MACHINE_IGNORED {
                m.remove(k);
            }
        }
        s
    };
    let mut paths = Vec::new();
    diff_paths(
        Some(&clean(current)),
        Some(&clean(desired)),
        &mut vec![],
        &mut paths,
    );
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for p in paths {
        let top = p.first().cloned().unwrap_or_default();
        if !seen.insert(top.clone()) {
            continue;
        }
        if top == "version" {
            out.push(version::version_unit(current, desired, root));
            continue;
        }
        let reason = match top.as_str() {
            "failureDomain" => "moving the Machine to another failure domain needs another host",
            _ => "no in-place handler for this Machine field",
        };
        out.push(DiffUnit::blocked(&toks(root, &[&top]), reason));
    }
    out
}

/// Differences of an InfraMachine spec (or template spec): re-provisioning material
/// (image, host selection, network data), never applied in place.
pub fn infrastructure(current: &Value, desired: &Value, root: &[&str]) -> Vec<DiffUnit> {
    let kind = str_of(desired, "kind")
        .unwrap_or("InfraMachine")
        .to_string();
    let mut paths = Vec::new();
    diff_paths(
        get(current, root),
        get(desired, root),
        &mut root.iter().map(|s| s.to_string()).collect(),
        &mut paths,
    );
    paths
        .into_iter()
        .map(|p| {
            DiffUnit::blocked(
                &p,
                format!("{kind} changes (image, host, network) need re-provisioning"),
            )
        })
        .collect()
}
