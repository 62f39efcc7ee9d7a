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
//!   ([`inplace_wire::k8s_version::Version`]).
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

/// Before anything is started: the Machine's `spec.version` (`machine_version`, `None`
/// when absent) must be a Kubernetes release version, and a node that has a kubelet whose
/// version it can not report (its `status.problems`) can not verify one. `Some` is the
/// Failure message, naming [`VERSION_FIELD`].
pub(crate) fn before_start(
    machine_version: Option<&str>,
    status: &pb::NodeStatus,
) -> Option<String> {
    let v = machine_version?;
    if let Err(e) = Version::parse(v) {
        return Some(format!(
            "{VERSION_FIELD}: {e}; it can not be verified on the node, nothing was applied"
        ));
    }
    if status.kubernetes_version.is_empty()
        && let Some(p) = status.problems.iter().find(|p| p.contains(UNREPORTED))
    {
        return Some(format!(
            "{VERSION_FIELD} {v}: the node does not report its Kubernetes version ({p}); it can not be verified, nothing was applied"
        ));
    }
    None
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
        assert_eq!(before_start(None, &status("", &[PROBLEM])), None);
        assert_eq!(before_start(Some("v1.35.2"), &status("v1.34.3", &[])), None);
        // a node with no kubelet where the agent looks: the version is not translated
        assert_eq!(before_start(Some("v1.35.2"), &status("", &[])), None);
        let bad = before_start(Some("v1.35.0-rc.1"), &status("v1.34.3", &[])).unwrap();
        assert!(
            bad.starts_with("spec.version: \"v1.35.0-rc.1\" is not a Kubernetes release version"),
            "{bad}"
        );
        assert!(bad.ends_with("nothing was applied"), "{bad}");
        let unreported = before_start(Some("v1.35.2"), &status("", &[PROBLEM])).unwrap();
        assert!(unreported.starts_with("spec.version v1.35.2: the node does not report its Kubernetes version (the kubelet at /usr/bin/kubelet"), "{unreported}");
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
