//! The Cluster API side: turn node coverage into exact in-place hook answers.
//!
//! - [`types`]: the hook wire types (`hooks.runtime.cluster.x-k8s.io/v1alpha1`).
//! - [`translate`]: KubeadmConfig / Machine / InfraMachine differences → units and the
//!   NodeSpec the node is asked about.
//! - [`patch`]: RFC 6902 patches that copy exactly the covered units.
//! - this module: [`decide`], which combines the units with a [`NodeCoverage`] (from an
//!   agent's coverage report, or from declared capabilities for MachineSets), and the
//!   pure answers of the two CanUpdate hooks ([`can_update_machine`],
//!   [`can_update_machine_set`]).
//!
//! All of it is free of I/O; `crate` does the HTTPS and gRPC.

pub mod patch;
pub mod translate;
pub mod types;

use std::collections::BTreeMap;

use serde_json::Value;

use inplace_wire::ids::ChangeId;
use inplace_wire::pb;
use translate::DiffUnit;
use types::{
    API_VERSION, CanUpdateMachineRequest, CanUpdateMachineResponse, CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse, MachineObjects, MachineSetObjects, Patch, Status,
    UpdateMachineRequest,
};

impl CanUpdateMachineRequest {
    /// Removes bootstrap secrets from both bootstrap configs ([`translate::redact`]).
    pub fn redact(&mut self) {
        for b in [
            &mut self.current.bootstrap_config,
            &mut self.desired.bootstrap_config,
        ]
        .into_iter()
        .flatten()
        {
            translate::redact(b);
        }
    }
}

impl CanUpdateMachineSetRequest {
    /// Removes bootstrap secrets from both templates ([`translate::redact`]).
    pub fn redact(&mut self) {
        for b in [
            &mut self.current.bootstrap_config_template,
            &mut self.desired.bootstrap_config_template,
        ]
        .into_iter()
        .flatten()
        {
            translate::redact(b);
        }
    }
}

impl UpdateMachineRequest {
    /// Removes bootstrap secrets from the desired bootstrap config ([`translate::redact`]).
    pub fn redact(&mut self) {
        if let Some(b) = self.desired.bootstrap_config.as_mut() {
            translate::redact(b);
        }
    }
}

/// What the node (or the capability model) says about each agent change id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeCoverage {
    /// Change id → `Ok` (covered) or the reason it is not.
    pub changes: BTreeMap<String, Result<(), String>>,
    /// The node recommends keeping the Machine rather than replacing it.
    pub preserve: bool,
    /// Why (e.g. "bare metal: DMI vendor ...").
    pub preserve_reasons: Vec<String>,
    /// Short disruption summary for messages ("restart of kubelet.service").
    pub disruption: String,
    /// Change ids whose disruption stops the node's workloads (drain or reboot): the
    /// input of `affectsAvailability` ([`affects_availability`]).
    pub unavailable: std::collections::BTreeSet<String>,
}

/// Whether a disruption level takes the Machine's workloads away: drain and reboot do;
/// none, reload, a unit restart (the kubelet, containerd, a time daemon: running Pods stay)
/// and daemon-reload do not.
pub fn stops_workloads(level: i32) -> bool {
    level >= pb::DisruptionLevel::Drain as i32
}

/// `affectsAvailability` for an answer that copies `covered` units: `Some(true)` if any
/// of their changes drains or reboots the node, `Some(false)` if none does, `None` when
/// nothing is covered (no in-place update to describe; unset reads as true upstream).
///
/// Upstream (cluster-api #14160, proposal #14161, MachineDeployments #14195): an unset
/// field means the in-place update affects availability, as before; `false` lets a
/// MachineDeployment with `maxUnavailable: 0` update in place without creating a surge
/// Machine first, the difference between a rollout and a wait for spare hardware on bare
/// metal.
pub fn affects_availability(covered: &[DiffUnit], cov: &NodeCoverage) -> Option<bool> {
    if covered.is_empty() {
        return None;
    }
    Some(
        covered
            .iter()
            .flat_map(|u| &u.ids)
            .any(|id| cov.unavailable.contains(id)),
    )
}

impl NodeCoverage {
    /// From an agent's coverage report.
    ///
    /// A change the node does not cover but already has as desired (same before and
    /// after summary, e.g. a provisioned file under a path the agent's policy does not
    /// write) counts as covered: UpdateMachine leaves such items out of the apply.
    pub fn from_report(r: &pb::CoverageReport) -> NodeCoverage {
        let changes = r
            .changes
            .iter()
            .map(|c| {
                let v = if c.covered || already_in_place(c) {
                    Ok(())
                } else {
                    Err(c.reason.clone())
                };
                (c.id.clone(), v)
            })
            .collect();
        let disruption = r
            .max_disruption
            .as_ref()
            .map(|d| {
                let level = pb::DisruptionLevel::try_from(d.level)
                    .map(|l| {
                        l.as_str_name()
                            .trim_start_matches("DISRUPTION_LEVEL_")
                            .to_lowercase()
                    })
                    .unwrap_or_default();
                if d.units.is_empty() {
                    level
                } else {
                    format!("{level} of {}", d.units.join(", "))
                }
            })
            .unwrap_or_default();
        let unavailable = r
            .changes
            .iter()
            .filter(|c| {
                c.disruption
                    .as_ref()
                    .is_some_and(|d| stops_workloads(d.level))
            })
            .map(|c| c.id.clone())
            .collect();
        let (preserve, preserve_reasons) = r
            .preservation
            .as_ref()
            .map(|p| (p.preserve, p.reasons.clone()))
            .unwrap_or_default();
        NodeCoverage {
            changes,
            preserve,
            preserve_reasons,
            disruption,
            unavailable,
        }
    }
}

/// True if the node already has what the change asks for (before == after, known).
pub fn already_in_place(c: &pb::Change) -> bool {
    !c.before.is_empty() && c.before == c.after
}

/// Change families a MachineSet's agents declare they handle (the static capability model
/// of `CanUpdateMachineSet`, which must answer for every Machine without node state).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Capability {
    /// `files` items (and drop-ins).
    Files,
    /// kubelet flags from `kubeletExtraArgs`.
    KubeletExtraArgs,
    /// `ntp`.
    Ntp,
    /// Kubernetes version upgrades (`spec.template.spec.version`) a patch or one minor
    /// version up, as the version skew policy allows.
    #[serde(rename = "kubernetes-version")]
    KubernetesVersion,
}

/// The coverage the declared capabilities give to `ids`. Disruption follows the agents'
/// built-in rules: a kubelet CPU, memory or topology manager flag drains (it resets the
/// kubelet's checkpoint), any other flag restarts the kubelet, `ntp` restarts the time
/// daemon, and files have no disruption unless a node's `[[disruption]]` rules say so
/// (which the MachineSet answer cannot see: set `update.affects_availability` then).
pub fn capability_coverage(caps: &[Capability], units: &[DiffUnit]) -> NodeCoverage {
    let mut unavailable = std::collections::BTreeSet::new();
    for f in kubelet_flags(units) {
        if !inplace_formats::kubelet::checkpoints::kubelet_state_files(&[f.as_str()], true)
            .is_empty()
        {
            unavailable.insert(ChangeId::KubeletFlag(f).to_string());
        }
    }
    let mut changes = BTreeMap::new();
    for id in units.iter().flat_map(|u| &u.ids) {
        let family = match ChangeId::parse(id) {
            Ok(ChangeId::KubernetesVersion) => Capability::KubernetesVersion,
            Ok(ChangeId::KubeletFlag(_)) => Capability::KubeletExtraArgs,
            Ok(ChangeId::Ntp) => Capability::Ntp,
            _ => Capability::Files,
        };
        let v = if caps.contains(&family) {
            Ok(())
        } else {
            Err(format!(
                "the agents do not declare the {family:?} capability (machineSet.capabilities)"
            ))
        };
        changes.insert(id.clone(), v);
    }
    NodeCoverage {
        changes,
        unavailable,
        ..Default::default()
    }
}

/// The kubelet flags the change ids of `units` name (`kubelet.flags[<name>]`), in order.
fn kubelet_flags<'a>(units: impl IntoIterator<Item = &'a DiffUnit>) -> Vec<String> {
    units
        .into_iter()
        .flat_map(|u| &u.ids)
        .filter_map(|id| match ChangeId::parse(id) {
            Ok(ChangeId::KubeletFlag(f)) => Some(f),
            _ => None,
        })
        .collect()
}

/// Units split by coverage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// Units the patch copies from desired.
    pub covered: Vec<DiffUnit>,
    /// Units left different: (dotted path, reason).
    pub uncovered: Vec<(String, String)>,
}

/// Splits `units` by coverage: a unit is covered when it is not blocked and the node
/// covers every change id it needs (an id the report does not list needs no change).
/// Uncovered ids no unit names go to the units that claim unknown ids (drop-ins), or
/// block everything if none does (never claim coverage the node did not give).
pub fn decide(units: Vec<DiffUnit>, cov: &NodeCoverage) -> Decision {
    let named: std::collections::BTreeSet<&String> = units.iter().flat_map(|u| &u.ids).collect();
    let orphans: Vec<String> = cov
        .changes
        .iter()
        .filter(|(id, v)| v.is_err() && !named.contains(id))
        .map(|(id, v)| format!("{id}: {}", v.clone().err().unwrap_or_default()))
        .collect();
    let claimed = units.iter().any(|u| u.claims_unknown);
    let mut d = Decision::default();
    for u in units {
        let mut reasons: Vec<String> = u.blocked.iter().cloned().collect();
        for id in &u.ids {
            if let Some(Err(r)) = cov.changes.get(id) {
                reasons.push(format!("{id}: {r}"));
            }
        }
        if !orphans.is_empty() && (u.claims_unknown || !claimed) {
            reasons.extend(orphans.iter().cloned());
        }
        if reasons.is_empty() {
            d.covered.push(u);
        } else {
            d.uncovered.push((u.path.clone(), reasons.join("; ")));
        }
    }
    d
}

/// What a CanUpdate answer says, decided with it (the metrics' `answer` label; the
/// message says the same in words: "in place: ...", "not covered: ...").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Some units covered (patched), none left uncovered.
    Covered,
    /// Some unit not covered.
    NotCovered,
    /// Some unit not covered, and CAPI is asked to keep the Machine.
    Preserve,
    /// No differences.
    NoChanges,
}

impl Verdict {
    /// The verdict of decision `d`, `preserve` when CAPI is asked to keep the Machine.
    pub fn of(d: &Decision, preserve: bool) -> Verdict {
        if preserve {
            Verdict::Preserve
        } else if !d.uncovered.is_empty() {
            Verdict::NotCovered
        } else if !d.covered.is_empty() {
            Verdict::Covered
        } else {
            Verdict::NoChanges
        }
    }
}

/// How an ExtensionConfig asks for preservation (`settings.preserveOnInsufficientCoverage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreserveMode {
    /// Follow the node's recommendation (CanUpdateMachine) or the infrastructure kind
    /// (CanUpdateMachineSet).
    Auto,
    /// Always ask CAPI to keep a Machine that is not fully covered.
    Always,
    /// Never ask (CAPI replaces, as today).
    Never,
}

impl PreserveMode {
    /// Parses `auto`, `true`/`always`, `false`/`never` (case-insensitive). Errors name the
    /// setting and the values.
    pub fn parse(s: &str) -> Result<PreserveMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(PreserveMode::Auto),
            "true" | "always" => Ok(PreserveMode::Always),
            "false" | "never" => Ok(PreserveMode::Never),
            other => Err(format!(
                "settings.preserveOnInsufficientCoverage: {other:?} is not one of auto, true, false"
            )),
        }
    }
}

/// The differences of one request, rooted at `root` (`spec` for a Machine,
/// `spec.template.spec` for a MachineSet and its templates): the Machine's and the
/// InfraMachine's (always blocked), then the bootstrap config's, with the changed node
/// items in `delta`. Objects must be redacted.
fn diff(
    machine: (&Value, &Value),
    infra: (&Value, &Value),
    bootstrap: (Option<&Value>, Option<&Value>),
    root: &[&str],
) -> translate::Analysis {
    let mut units = translate::machine(machine.0, machine.1, root);
    let version = translate::version_delta(machine.0, machine.1, root);
    units.extend(translate::infrastructure(infra.0, infra.1, root));
    let problem = [bootstrap.0, bootstrap.1]
        .into_iter()
        .flatten()
        .find_map(translate::kubeadm_api_version_problem);
    let mut analysis = match bootstrap {
        // Not read at all: every difference of the object stays, so CAPI's comparison
        // fails, and the one unit says why.
        (Some(_), Some(_)) if problem.is_some() => translate::Analysis {
            units: vec![DiffUnit {
                blocked: problem,
                path: "bootstrapConfig.apiVersion".into(),
                ..DiffUnit::open(&["apiVersion".to_string()])
            }],
            ..Default::default()
        },
        (Some(c), Some(d)) => translate::kubeadm(c, d, root),
        (None, None) => translate::Analysis::default(),
        _ => translate::Analysis {
            units: vec![DiffUnit {
                blocked: Some("the bootstrap config exists on one side only".into()),
                path: "bootstrapConfig".into(),
                ..DiffUnit::open(&["spec".to_string()])
            }],
            ..Default::default()
        },
    };
    units.append(&mut analysis.units);
    analysis.units = units;
    analysis.delta.kubernetes = version;
    analysis
}

/// Covered units split by object: (the Machine's or MachineSet's own: the version,
/// the bootstrap config's).
fn by_object(covered: &[DiffUnit]) -> (Vec<DiffUnit>, Vec<DiffUnit>) {
    covered
        .iter()
        .cloned()
        .partition(|u| u.ids.iter().any(|id| id == translate::VERSION_ID))
}

/// True when two version strings name the same release (`v1.35.2` = `1.35.2`).
pub fn same_version(a: &str, b: &str) -> bool {
    match (
        inplace_wire::k8s_version::Version::parse(a),
        inplace_wire::k8s_version::Version::parse(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The NodeSpec UpdateMachine applies: the desired bootstrap config's
/// ([`desired_node_spec`]) and, when the node reports its Kubernetes version
/// (`reports_version`: `NodeStatus.kubernetes_version` is not empty), the Machine's
/// `spec.version`. A node that reports none was never covered for a version change (its
/// coverage says the version is not known), so its updates stay what they were.
pub fn update_node_spec(desired: &MachineObjects, reports_version: bool) -> pb::NodeSpec {
    with_version(desired_node_spec(desired), desired, reports_version)
}

/// `spec` (the desired bootstrap config's, [`desired_node_spec`]) with the Machine's
/// `spec.version` when the node reports its own (see [`update_node_spec`]), so a hook
/// decodes the files once.
pub fn with_version(
    mut spec: pb::NodeSpec,
    desired: &MachineObjects,
    reports_version: bool,
) -> pb::NodeSpec {
    if reports_version {
        spec.kubernetes = desired
            .machine
            .pointer("/spec/version")
            .and_then(Value::as_str)
            .map(|v| pb::Kubernetes {
                version: v.to_string(),
            });
    }
    spec
}

/// The differences of a CanUpdateMachine request (see [`diff`]).
pub fn machine_diff(current: &MachineObjects, desired: &MachineObjects) -> translate::Analysis {
    diff(
        (&current.machine, &desired.machine),
        (
            &current.infrastructure_machine,
            &desired.infrastructure_machine,
        ),
        (
            current.bootstrap_config.as_ref(),
            desired.bootstrap_config.as_ref(),
        ),
        &["spec"],
    )
}

/// The differences of a CanUpdateMachineSet request (see [`diff`]).
pub fn machine_set_diff(
    current: &MachineSetObjects,
    desired: &MachineSetObjects,
) -> translate::Analysis {
    diff(
        (&current.machine_set, &desired.machine_set),
        (
            &current.infrastructure_machine_template,
            &desired.infrastructure_machine_template,
        ),
        (
            current.bootstrap_config_template.as_ref(),
            desired.bootstrap_config_template.as_ref(),
        ),
        &["spec", "template", "spec"],
    )
}

/// The whole NodeSpec the desired bootstrap config asks for (see
/// [`translate::node_spec`]); empty without a bootstrap config, and for one the
/// translation does not read ([`translate::kubeadm_api_version_problem`]; UpdateMachine
/// refuses those before it applies anything).
pub fn desired_node_spec(desired: &MachineObjects) -> pb::NodeSpec {
    desired
        .bootstrap_config
        .as_ref()
        .filter(|b| translate::kubeadm_api_version_problem(b).is_none())
        .map(|b| translate::node_spec(b, &["spec"]).0)
        .unwrap_or_default()
}

/// [`desired_node_spec`], or why it can not be made: the files decode to more than
/// [`translate::MAX_DECODED_CONFIG_BYTES`] together ([`translate::node_spec_checked`]).
pub fn desired_node_spec_checked(desired: &MachineObjects) -> Result<pb::NodeSpec, String> {
    Ok(desired
        .bootstrap_config
        .as_ref()
        .filter(|b| translate::kubeadm_api_version_problem(b).is_none())
        .map(|b| translate::node_spec_checked(b, &["spec"]))
        .transpose()?
        .map(|(s, _)| s)
        .unwrap_or_default())
}

fn message(subject: &str, d: &Decision, disruption: &str, preserve: Option<&[String]>) -> String {
    let mut parts = Vec::new();
    if !d.covered.is_empty() {
        let paths: Vec<&str> = d.covered.iter().map(|u| u.path.as_str()).collect();
        let mut s = format!("in place: {}", paths.join(", "));
        if !disruption.is_empty() {
            s.push_str(&format!(" (node disruption: {disruption})"));
        }
        parts.push(s);
    }
    if !d.uncovered.is_empty() {
        let list: Vec<String> = d
            .uncovered
            .iter()
            .map(|(p, r)| format!("{p} ({r})"))
            .collect();
        parts.push(format!("not covered: {}", list.join("; ")));
    }
    if parts.is_empty() {
        parts.push("no spec changes".into());
    }
    if let Some(reasons) = preserve {
        let why = if reasons.is_empty() {
            "requested by settings".to_string()
        } else {
            reasons.join("; ")
        };
        parts.push(format!("asking CAPI to keep the Machine: {why}"));
    }
    format!("{subject}: {}", parts.join("; "))
}

fn patch_of(current: &Value, desired: &Value, units: &[DiffUnit]) -> Option<Patch> {
    let us: Vec<patch::Unit> = units.iter().map(|u| u.unit.clone()).collect();
    let ops = patch::operations(current, desired, &us);
    (!ops.is_empty()).then(|| Patch::json_patch(&ops))
}

/// The CanUpdateMachine answer from the request's differences ([`machine_diff`]) and the
/// node's coverage. `cov` is `None` when the node was not asked (nothing to apply on it
/// and no preservation question).
pub fn can_update_machine(
    current: &MachineObjects,
    desired: &MachineObjects,
    diff: translate::Analysis,
    cov: Option<&NodeCoverage>,
    mode: PreserveMode,
) -> CanUpdateMachineResponse {
    can_update_machine_with_verdict(current, desired, diff, cov, mode).0
}

/// [`can_update_machine`] and its [`Verdict`].
pub fn can_update_machine_with_verdict(
    current: &MachineObjects,
    desired: &MachineObjects,
    diff: translate::Analysis,
    cov: Option<&NodeCoverage>,
    mode: PreserveMode,
) -> (CanUpdateMachineResponse, Verdict) {
    let empty = NodeCoverage::default();
    let cov = cov.unwrap_or(&empty);
    let d = decide(diff.units, cov);
    // InfraMachine units are always blocked; of the Machine's, only the version can be
    // covered
    let (own, boot) = by_object(&d.covered);
    let machine_patch = patch_of(&current.machine, &desired.machine, &own);
    let bootstrap_config_patch = match (&current.bootstrap_config, &desired.bootstrap_config) {
        (Some(c), Some(dd)) => patch_of(c, dd, &boot),
        _ => None,
    };
    let preserve = !d.uncovered.is_empty()
        && match mode {
            PreserveMode::Always => true,
            PreserveMode::Never => false,
            PreserveMode::Auto => cov.preserve,
        };
    let name = desired
        .machine
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("machine");
    let reasons = if mode == PreserveMode::Auto {
        cov.preserve_reasons.clone()
    } else {
        vec![]
    };
    let verdict = Verdict::of(&d, preserve);
    let resp = CanUpdateMachineResponse {
        api_version: API_VERSION.into(),
        kind: "CanUpdateMachineResponse".into(),
        status: Status::Success,
        message: message(name, &d, &cov.disruption, preserve.then_some(&reasons[..])),
        machine_patch,
        infrastructure_machine_patch: None,
        affects_availability: bootstrap_config_patch
            .as_ref()
            .and_then(|_| affects_availability(&d.covered, cov)),
        bootstrap_config_patch,
        preserve_on_insufficient_coverage: preserve.then_some(true),
    };
    (resp, verdict)
}

/// The node disruption a MachineSet answer implies, from the covered kubelet flags (the
/// agents' built-in rules: a CPU, memory or topology manager change drains and resets the
/// kubelet's checkpoint, any other flag restarts the kubelet).
fn set_disruption(d: &Decision) -> String {
    let flags = kubelet_flags(&d.covered);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let version = d
        .covered
        .iter()
        .any(|u| u.ids.iter().any(|id| id == translate::VERSION_ID));
    if version {
        "drain (a minor Kubernetes upgrade, or a control-plane node) or a kubelet restart (a patch upgrade of a worker)".into()
    } else if !inplace_formats::kubelet::checkpoints::kubelet_state_files(&flags, true).is_empty() {
        "drain, kubelet stopped, its CPU/memory manager checkpoint removed, kubelet started".into()
    } else if !flags.is_empty() {
        "restart of kubelet.service".into()
    } else {
        String::new()
    }
}

/// The CanUpdateMachineSet answer: deterministic, from the translation and the declared
/// capabilities only; preservation from `mode`, or in `Auto` mode from whether the
/// infrastructure template kind is one of `hardware_bound_kinds`.
pub fn can_update_machine_set(
    current: &MachineSetObjects,
    desired: &MachineSetObjects,
    caps: &[Capability],
    mode: PreserveMode,
    hardware_bound_kinds: &[String],
) -> CanUpdateMachineSetResponse {
    can_update_machine_set_with_verdict(current, desired, caps, mode, hardware_bound_kinds).0
}

/// [`can_update_machine_set`] and its [`Verdict`].
pub fn can_update_machine_set_with_verdict(
    current: &MachineSetObjects,
    desired: &MachineSetObjects,
    caps: &[Capability],
    mode: PreserveMode,
    hardware_bound_kinds: &[String],
) -> (CanUpdateMachineSetResponse, Verdict) {
    let units = machine_set_diff(current, desired).units;
    let cov = capability_coverage(caps, &units);
    let d = decide(units, &cov);
    let (own, boot) = by_object(&d.covered);
    let machine_set_patch = patch_of(&current.machine_set, &desired.machine_set, &own);
    let bootstrap_config_template_patch = match (
        &current.bootstrap_config_template,
        &desired.bootstrap_config_template,
    ) {
        (Some(c), Some(dd)) => patch_of(c, dd, &boot),
        _ => None,
    };
    let kind = desired
        .infrastructure_machine_template
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let bound = hardware_bound_kinds.contains(&kind);
    let preserve = !d.uncovered.is_empty()
        && match mode {
            PreserveMode::Always => true,
            PreserveMode::Never => false,
            PreserveMode::Auto => bound,
        };
    let reasons = if mode == PreserveMode::Auto {
        vec![format!(
            "{kind} machines are hardware-bound (preservation.hardwareBoundKinds)"
        )]
    } else {
        vec![]
    };
    let name = current
        .machine_set
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("machineset");
    let replicas = current
        .machine_set
        .pointer("/spec/replicas")
        .and_then(Value::as_i64);
    let subject = match replicas {
        Some(n) => format!("{name} ({n} machines)"),
        None => name.to_string(),
    };
    let verdict = Verdict::of(&d, preserve);
    let resp = CanUpdateMachineSetResponse {
        api_version: API_VERSION.into(),
        kind: "CanUpdateMachineSetResponse".into(),
        status: Status::Success,
        message: message(
            &subject,
            &d,
            &set_disruption(&d),
            preserve.then_some(&reasons[..]),
        ),
        machine_set_patch,
        infrastructure_machine_template_patch: None,
        affects_availability: bootstrap_config_template_patch
            .as_ref()
            .and_then(|_| affects_availability(&d.covered, &cov)),
        bootstrap_config_template_patch,
        preserve_on_insufficient_coverage: preserve.then_some(true),
    };
    (resp, verdict)
}

#[cfg(test)]
mod tests;
