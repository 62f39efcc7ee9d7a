//! "Done" means verified: the fields of the desired Machine that UpdateMachine translates
//! into the NodeSpec are checked against what the node reports before the hook answers
//! done. A field that can not be verified is a `Failure` naming it, never a silent drop.
//!
//! The fields and how each is verified:
//! - the bootstrap config's `files`, `kubeletExtraArgs`, `ntp`, sysctls and drop-ins: by the
//!   agent, whose operation succeeds only after it read each item back from the node (an
//!   item left out because the node already has it is verified by its coverage, `before ==
//!   after`, [`crate::capi::already_in_place`]);
//! - the Machine's `spec.version`: by the node's `NodeStatus.kubernetes_version` (the
//!   `kubelet --version` of the kubelet the agent manages), which must parse and equal it
//!   ([`inplace_wire::k8s_version::Version`]); on a node where the agent finds no kubelet,
//!   by the `[cluster]` Node's `status.nodeInfo.kubeletVersion`, else not at all: a
//!   Failure naming the field ([`before_start`]).
//!
//! Pure functions over the translated spec, the Machine's version and the agent's answers.

use inplace_wire::k8s_version::Version;
use inplace_wire::pb;

/// The field of the desired Machine that holds the Kubernetes version.
pub(crate) const VERSION_FIELD: &str = "spec.version";

/// The status problem the agent reports when a kubelet is installed where it looks but
/// its `--version` does not parse (crates/agent/src/apply/own_problems.rs): the node has a
/// version it can not report.
const UNREPORTED: &str = "does not report a version";

/// What the node's answer says about the translated fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every translated field is verified on the node.
    Verified,
    /// Not yet: the node may still settle (a version not yet reported as the target).
    Wait(String),
    /// A field can not be verified: the message names it and why (a `Failure`).
    Unverifiable(String),
}

/// How the Machine's `spec.version` is verified, decided before anything is started
/// ([`before_start`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VersionCheck {
    /// The Machine names no version.
    Absent,
    /// By the node's agent: the version joins the NodeSpec and the node's status must
    /// report it after the operation ([`after_success`]).
    Agent,
    /// By the workload cluster's Node, whose `status.nodeInfo.kubeletVersion` already is
    /// the Machine's version while the agent finds no kubelet where it looks: the version
    /// is not part of the NodeSpec (nothing to upgrade) and the Node check after the
    /// operation ([`crate::cluster::node::back`]) verifies it.
    Node,
}

/// Whether [`before_start`] needs the Node's kubelet version: the Machine names a version
/// and the node's agent reports none without a kubelet that fails to answer (it finds
/// no kubelet where it looks, `[kubernetes] bin_dir`).
pub(crate) fn needs_node(machine_version: Option<&str>, status: &pb::NodeStatus) -> bool {
    machine_version.is_some()
        && status.kubernetes_version.is_empty()
        && !status.problems.iter().any(|p| p.contains(UNREPORTED))
}

/// Before anything is started: how the Machine's `spec.version` (`machine_version`,
/// `None` when absent) will be verified, or the Failure message naming
/// [`VERSION_FIELD`]. The version must be a Kubernetes release version; a node whose
/// kubelet does not report its version (a `status.problems` entry) can not verify one;
/// a node whose agent finds no kubelet (`agent_reason`: its coverage's reason for
/// `kubernetes.version`, naming the path it looked at) verifies it only through the
/// `[cluster]` Node's kubelet version (`node_kubelet`), which must then equal it: never
/// is the version dropped unverified.
pub(crate) fn before_start(
    machine_version: Option<&str>,
    status: &pb::NodeStatus,
    agent_reason: Option<&str>,
    node_kubelet: Option<&str>,
) -> Result<VersionCheck, String> {
    let Some(v) = machine_version else {
        return Ok(VersionCheck::Absent);
    };
    let want = Version::parse(v).map_err(|e| {
        format!("{VERSION_FIELD}: {e}; it can not be verified on the node, nothing was applied")
    })?;
    if !status.kubernetes_version.is_empty() {
        return Ok(VersionCheck::Agent);
    }
    if let Some(p) = status.problems.iter().find(|p| p.contains(UNREPORTED)) {
        return Err(format!(
            "{VERSION_FIELD} {v}: the node does not report its Kubernetes version ({p}); it can not be verified, nothing was applied"
        ));
    }
    let why = agent_reason.map(|r| format!(" ({r})")).unwrap_or_default();
    match node_kubelet.filter(|k| !k.is_empty()) {
        Some(k) if Version::parse(k) == Ok(want) => Ok(VersionCheck::Node),
        Some(k) => Err(format!(
            "{VERSION_FIELD} {v}: the node's agent finds no kubelet to read or upgrade{why} and the Node's kubelet reports {k}; the version can not be reached in place, nothing was applied"
        )),
        None => Err(format!(
            "{VERSION_FIELD} {v}: the node's agent finds no kubelet to read its version{why} and no Node kubelet version ([cluster]) verifies it; nothing was applied: point the agent's [kubernetes] bin_dir at the kubelet"
        )),
    }
}

/// After the operation of the translated spec succeeded: done only when every field it
/// holds is verified; `kubernetes` is the spec's `kubernetes` field (the driver keeps only
/// it once the spec is handed to the agent). The Kubernetes version must be reported by the node
/// (`status`, read after the operation), parse, and equal the target: a node that reports
/// none, or one that does not parse, is [`Verdict::Unverifiable`] naming
/// [`VERSION_FIELD`]; another version is [`Verdict::Wait`] (the node may still settle).
pub(crate) fn after_success(
    kubernetes: Option<&pb::Kubernetes>,
    status: &pb::NodeStatus,
) -> Verdict {
    let Some(k) = kubernetes else {
        return Verdict::Verified;
    };
    let target = match Version::parse(&k.version) {
        Ok(t) => t,
        Err(e) => return Verdict::Unverifiable(format!("{VERSION_FIELD}: {e}")),
    };
    let reported = status.kubernetes_version.as_str();
    if reported.is_empty() {
        let why = status
            .problems
            .iter()
            .find(|p| p.contains(UNREPORTED))
            .map(|p| format!(" ({p})"))
            .unwrap_or_default();
        return Verdict::Unverifiable(format!(
            "{VERSION_FIELD} {}: the update succeeded but the node does not report a Kubernetes version{why}, so the version can not be verified",
            k.version
        ));
    }
    match Version::parse(reported) {
        Err(e) => Verdict::Unverifiable(format!(
            "{VERSION_FIELD} {}: the node reports a version that does not parse: {e}",
            k.version
        )),
        Ok(r) if r == target => Verdict::Verified,
        Ok(_) => Verdict::Wait(format!(
            "waiting for the node to report Kubernetes {} (it reports {reported:?})",
            k.version
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(version: &str, problems: &[&str]) -> pb::NodeStatus {
        pb::NodeStatus {
            kubernetes_version: version.into(),
            problems: problems.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        }
    }

    fn spec(version: Option<&str>) -> Option<&'static pb::Kubernetes> {
        version.map(|v| &*Box::leak(Box::new(pb::Kubernetes { version: v.into() })))
    }

    const PROBLEM: &str = "the kubelet at /usr/bin/kubelet does not report a version `/usr/bin/kubelet --version` parses: Kubernetes version upgrades are not covered until it does";

    #[test]
    fn before_start_names_the_field() {
        let go = |v, st: &pb::NodeStatus| before_start(v, st, None, None);
        assert_eq!(go(None, &status("", &[PROBLEM])), Ok(VersionCheck::Absent));
        assert_eq!(
            go(Some("v1.35.2"), &status("v1.34.3", &[])),
            Ok(VersionCheck::Agent)
        );
        let bad = go(Some("v1.35.0-rc.1"), &status("v1.34.3", &[])).unwrap_err();
        assert!(
            bad.starts_with("spec.version: \"v1.35.0-rc.1\" is not a Kubernetes release version"),
            "{bad}"
        );
        assert!(bad.ends_with("nothing was applied"), "{bad}");
        let unreported = go(Some("v1.35.2"), &status("", &[PROBLEM])).unwrap_err();
        assert!(unreported.starts_with("spec.version v1.35.2: the node does not report its Kubernetes version (the kubelet at /usr/bin/kubelet"), "{unreported}");
    }

    /// issue 27 §2: a node with no kubelet where the agent looks never drops the version:
    /// the Node's kubelet version verifies it, else it is a Failure naming the field.
    #[test]
    fn no_kubelet_is_verified_by_the_node_or_a_failure() {
        let none = status("", &[]);
        let why = "the node's Kubernetes version is not known: /usr/bin/kubelet is absent";
        assert!(needs_node(Some("v1.35.2"), &none));
        assert!(!needs_node(Some("v1.35.2"), &status("", &[PROBLEM])));
        assert!(!needs_node(Some("v1.35.2"), &status("v1.35.2", &[])));
        assert!(!needs_node(None, &none));
        assert_eq!(
            before_start(Some("v1.35.2"), &none, Some(why), Some("v1.35.2")),
            Ok(VersionCheck::Node)
        );
        assert_eq!(
            before_start(Some("1.35.2"), &none, Some(why), Some("v1.35.2")),
            Ok(VersionCheck::Node)
        );
        assert_eq!(
            before_start(Some("v1.35.2"), &none, Some(why), Some("v1.34.3")),
            Err(format!(
                "spec.version v1.35.2: the node's agent finds no kubelet to read or upgrade ({why}) and the Node's kubelet reports v1.34.3; the version can not be reached in place, nothing was applied"
            ))
        );
        assert_eq!(
            before_start(Some("v1.35.2"), &none, Some(why), None),
            Err(format!(
                "spec.version v1.35.2: the node's agent finds no kubelet to read its version ({why}) and no Node kubelet version ([cluster]) verifies it; nothing was applied: point the agent's [kubernetes] bin_dir at the kubelet"
            ))
        );
        assert!(before_start(Some("v1.35.2"), &none, None, Some("")).is_err());
    }

    #[test]
    fn after_success_verifies_the_version() {
        assert_eq!(
            after_success(spec(None), &status("", &[])),
            Verdict::Verified
        );
        assert_eq!(
            after_success(spec(Some("v1.35.2")), &status("v1.35.2", &[])),
            Verdict::Verified
        );
        assert_eq!(
            after_success(spec(Some("1.35.2")), &status("v1.35.2", &[])),
            Verdict::Verified
        );
        assert_eq!(
            after_success(spec(Some("v1.35.2")), &status("v1.34.3", &[])),
            Verdict::Wait(
                "waiting for the node to report Kubernetes v1.35.2 (it reports \"v1.34.3\")".into()
            )
        );
        assert_eq!(
            after_success(spec(Some("v1.35.2")), &status("", &[PROBLEM])),
            Verdict::Unverifiable(format!(
                "spec.version v1.35.2: the update succeeded but the node does not report a Kubernetes version ({PROBLEM}), so the version can not be verified"
            ))
        );
        assert_eq!(
            after_success(spec(Some("v1.35.2")), &status("", &[])),
            Verdict::Unverifiable("spec.version v1.35.2: the update succeeded but the node does not report a Kubernetes version, so the version can not be verified".into())
        );
        let Verdict::Unverifiable(m) =
            after_success(spec(Some("v1.35.2")), &status("1.35.2-gke.1", &[]))
        else {
            panic!("an unparseable report is unverifiable");
        };
        assert!(m.starts_with("spec.version v1.35.2: the node reports a version that does not parse: \"1.35.2-gke.1\""), "{m}");
        let Verdict::Unverifiable(m) = after_success(spec(Some("latest")), &status("v1.35.2", &[]))
        else {
            panic!("an unparseable target is unverifiable");
        };
        assert!(m.starts_with("spec.version: \"latest\" is not"), "{m}");
    }
}
