//! The `kubernetes` section: its spec part (the version parsed, set once, hashed only
//! when set) and its planning as a pure function of the wanted version, the node's
//! versions and kubeadm files, and the agent config.

use super::effects::UpgradeKubernetes;
use super::observe::KubernetesObs;
use super::{ID, Kubernetes};
use crate::config::Config;
use crate::kubernetes::SourceKind;
use crate::plan::{Plan, plan_over};
use crate::sections::kit::Options;
use crate::sections::kit::tests::spec;
use crate::sections::model::{NodeSpec, Observed};
use crate::state::AppliedRecord;
use inplace_wire::k8s_version::Version;
use inplace_wire::pb::DisruptionLevel;

#[test]
fn the_version_is_parsed_set_once_and_hashed_only_when_set() {
    let s = spec("kubernetes: {version: 1.35.2}\n", &[]).unwrap();
    assert_eq!(s.kubernetes.unwrap().version.to_string(), "v1.35.2");
    let e = spec("kubernetes: {version: v1.35}\n", &[]).unwrap_err();
    assert_eq!(e.field, "kubernetes.version");
    let e = spec(
        "kubernetes: {version: v1.35.2}\n",
        &[("a.yaml", "kubernetes: {version: v1.35.2}\n")],
    )
    .unwrap_err();
    assert_eq!(e.field, "dropins[a.yaml].kubernetes.version");
    assert_eq!(
        e.message,
        "kubernetes.version is already set by kubernetes; set it once"
    );
    let empty = spec("kubernetes: {version: \"\"}\n", &[]).unwrap();
    assert_eq!(empty.kubernetes, None);
    assert_eq!(empty.hash(), NodeSpec::default().hash());
    assert_ne!(
        spec("kubernetes: {version: v1.35.2}\n", &[])
            .unwrap()
            .hash(),
        NodeSpec::default().hash()
    );
}

fn v(s: &str) -> Version {
    Version::parse(s).unwrap()
}

/// A kubeadm worker whose kubelet and kubeadm run `running`.
fn worker(running: &str) -> KubernetesObs {
    KubernetesObs {
        kubelet: Ok(v(running)),
        kubeadm: Ok(v(running)),
        missing_kubeadm_files: Vec::new(),
        control_plane: false,
        other_kubelet: None,
        manifests: Vec::new(),
        checksums: None,
    }
}

fn plan_to(want: &str, node: KubernetesObs, source: SourceKind) -> Plan {
    let desired = spec(&format!("kubernetes: {{version: {want}}}\n"), &[]).unwrap();
    let mut obs = Observed::empty();
    obs.kubernetes = Some(node);
    let mut config = Config::default();
    config.kubernetes.source = source;
    plan_over(
        &[&Kubernetes],
        &desired,
        &obs,
        &AppliedRecord::default(),
        &config,
        Options::default(),
    )
}

#[test]
fn a_patch_upgrade_of_a_worker_restarts_the_kubelet() {
    let p = plan_to("v1.35.3", worker("v1.35.2"), SourceKind::Apt);
    let c = &p.report.changes[0];
    assert_eq!(c.id, ID);
    assert!(c.covered, "{}", c.reason);
    assert_eq!(
        (c.before.as_str(), c.after.as_str()),
        ("v1.35.2", "v1.35.3")
    );
    let d = c.disruption.as_ref().unwrap();
    assert_eq!(d.level, DisruptionLevel::Restart as i32);
    assert_eq!(d.units, ["kubelet.service"]);
    let u = &p.steps.effects_of::<UpgradeKubernetes>().next().unwrap().0;
    assert_eq!(
        (u.from, u.to, u.control_plane),
        (v("v1.35.2"), v("v1.35.3"), false)
    );
}

#[test]
fn a_minor_upgrade_drains() {
    let p = plan_to("v1.35.0", worker("v1.34.4"), SourceKind::Dnf);
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert_eq!(
        c.disruption.as_ref().unwrap().level,
        DisruptionLevel::Drain as i32
    );
}

#[test]
fn what_stops_an_upgrade_is_said() {
    let unknown = KubernetesObs {
        kubelet: Err("/usr/bin/kubelet is absent".into()),
        ..worker("v1.35.2")
    };
    let not_kubeadm = KubernetesObs {
        missing_kubeadm_files: vec!["/var/lib/kubelet/kubeadm-flags.env".into()],
        ..worker("v1.35.2")
    };
    for (node, source, says) in [
        (
            unknown,
            SourceKind::Apt,
            "version is not known: /usr/bin/kubelet is absent",
        ),
        (
            not_kubeadm,
            SourceKind::Apt,
            "the node was not set up by kubeadm",
        ),
        (
            worker("v1.35.2"),
            SourceKind::None,
            "no source for the Kubernetes binaries",
        ),
        (worker("v1.33.0"), SourceKind::Apt, ""),
    ] {
        let p = plan_to("v1.35.3", node, source);
        let c = &p.report.changes[0];
        assert!(!c.covered, "{says}");
        assert!(c.reason.contains(says), "{}", c.reason);
        assert_eq!(p.steps.effects_of::<UpgradeKubernetes>().count(), 0);
    }
}

#[test]
fn at_the_version_already_only_a_stale_manifest_is_a_change() {
    let p = plan_to("v1.35.2", worker("v1.35.2"), SourceKind::Apt);
    assert!(p.report.changes.is_empty());
    let cp = KubernetesObs {
        control_plane: true,
        manifests: vec![(
            "/etc/kubernetes/manifests/kube-apiserver.yaml".into(),
            Ok(vec!["v1.35.1".into()]),
        )],
        ..worker("v1.35.2")
    };
    let p = plan_to("v1.35.2", cp, SourceKind::Apt);
    let c = &p.report.changes[0];
    assert!(!c.covered);
    assert!(
        c.reason.contains("kube-apiserver.yaml names v1.35.1"),
        "{}",
        c.reason
    );
}
