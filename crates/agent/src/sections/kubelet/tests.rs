//! The `kubelet` section: its spec part (config fields typed, flags named, merged leaf by
//! leaf and flag by flag, hashed) and its planning of kubeadm's flags file and the
//! KubeletConfiguration file as a pure function of desired, observed and applied.

use super::Kubelet;
use super::observe::KubeletObs;
use crate::sections::kit::observe::TextObs;
use crate::sections::kit::tests::{ids, plan, spec};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::{AppliedRecord, ManagedValue};
use inplace_node::sysroot::{Entry, Kind};
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

const FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
const CONFIG: &str = "/var/lib/kubelet/config.yaml";

#[test]
fn config_and_flag_errors_name_the_field() {
    for (yaml, field) in [
        (
            "kubelet:\n  config:\n    apiVersion: v1\n",
            "kubelet.config.apiVersion",
        ),
        ("kubelet:\n  config:\n    kind: X\n", "kubelet.config.kind"),
        (
            "kubelet:\n  config:\n    maxPods: many\n",
            "kubelet.config.maxPods",
        ),
    ] {
        let e = spec(yaml, &[]).unwrap_err();
        assert_eq!(e.field, field, "{yaml}: {e}");
    }
    // the wire form, which the YAML form's own checks do not guard
    for (name, value, says) in [
        ("--max-pods", "1", "without leading dashes"),
        ("Max", "1", "without leading dashes, in lower case"),
        (
            "v",
            "a b",
            "systemd splits KUBELET_KUBEADM_ARGS on whitespace",
        ),
    ] {
        let p = pb::NodeSpec {
            kubelet: Some(pb::Kubelet {
                flags: [(name.to_string(), value.to_string())].into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = NodeSpec::from_pb(&p).unwrap_err();
        assert_eq!(e.field, format!("kubelet.flags[{name}]"));
        assert!(e.message.contains(says), "{e}");
    }
    // an empty config is no config
    let s = spec("kubelet:\n  config: {}\n", &[]).unwrap();
    assert_eq!(s.kubelet.config, None);
    assert_eq!(s.hash(), NodeSpec::default().hash());
}

#[test]
fn config_merges_leaf_by_leaf_and_a_changed_leaf_names_both_sources() {
    let s = spec(
        "kubelet:\n  config:\n    systemReserved: {cpu: 500m}\n",
        &[(
            "a.yaml",
            "kubelet:\n  config:\n    systemReserved: {cpu: 500m, memory: 1Gi}\n",
        )],
    )
    .unwrap();
    assert_eq!(
        serde_json::Value::Object(s.kubelet.config.unwrap()),
        serde_json::json!({"systemReserved": {"cpu": "500m", "memory": "1Gi"}})
    );
    let e = spec(
        "kubelet:\n  config:\n    systemReserved: {cpu: 500m}\n",
        &[(
            "a.yaml",
            "kubelet:\n  config:\n    systemReserved: {cpu: \"1\"}\n",
        )],
    )
    .unwrap_err();
    assert_eq!(e.field, "dropins[a.yaml].kubelet.config.systemReserved.cpu");
    assert_eq!(
        e.message,
        "kubelet.config.systemReserved.cpu is already set to \"500m\"; a field may be set by several sources only with the same value"
    );
}

#[test]
fn a_flag_is_set_once_and_a_changed_value_names_both_sources() {
    let e = spec(
        "",
        &[
            ("a.yaml", "kubelet:\n  flags: {max-pods: \"1\"}\n"),
            ("b.yaml", "kubelet:\n  flags: {max-pods: \"2\"}\n"),
        ],
    )
    .unwrap_err();
    assert_eq!(e.field, "dropins[b.yaml].kubelet.flags[max-pods]");
    assert_eq!(
        e.message,
        "dropins[a.yaml].kubelet.flags[max-pods] sets it to \"1\", this source to \"2\"; set it once"
    );
    let s = spec(
        "kubelet:\n  flags: {max-pods: \"1\"}\n",
        &[("a.yaml", "kubelet:\n  flags: {max-pods: \"1\"}\n")],
    )
    .unwrap();
    assert_eq!(s.kubelet.flags["max-pods"], "1");
}

#[test]
fn config_key_order_does_not_change_the_hash() {
    let a = spec(
        "kubelet:\n  config:\n    maxPods: 1\n    systemReserved: {cpu: \"1\", memory: 1Gi}\n",
        &[],
    )
    .unwrap();
    let b = spec(
        "kubelet:\n  config:\n    systemReserved: {memory: 1Gi, cpu: \"1\"}\n    maxPods: 1\n",
        &[],
    )
    .unwrap();
    assert_eq!(a.hash(), b.hash());
}

fn text(t: &str) -> TextObs {
    TextObs::Text(
        t.into(),
        Entry {
            kind: Kind::File,
            mode: 0o644,
            uid: 0,
            gid: 0,
            len: t.len() as u64,
        },
    )
}

fn observed(config: TextObs, flags: TextObs) -> Observed {
    let mut obs = Observed::empty();
    obs.kubelet = KubeletObs {
        config,
        flags,
        ..KubeletObs::default()
    };
    obs
}

#[test]
fn a_flag_is_edited_into_kubeadms_file_with_a_restart() {
    let desired = spec("kubelet:\n  flags: {max-pods: \"250\"}\n", &[]).unwrap();
    let obs = observed(
        TextObs::Absent,
        text("KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.1\"\n"),
    );
    let p = plan(&[&Kubelet], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["kubelet.flags[max-pods]"]);
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert_eq!(c.operation, ChangeOperation::Create as i32);
    assert_eq!(
        c.disruption.as_ref().unwrap().level,
        DisruptionLevel::Restart as i32
    );
    let w = &p.steps.writes[0];
    assert_eq!(w.path, FLAGS);
    let t = String::from_utf8(w.content.clone()).unwrap();
    assert!(
        t.contains("--node-ip=10.0.0.1") && t.contains("--max-pods=250"),
        "{t}"
    );
    assert!(p.steps.restarts.contains("kubelet.service"));
    assert_eq!(
        p.record.kubelet_flags["max-pods"],
        ManagedValue {
            value: "250".into(),
            prior: None
        }
    );
}

#[test]
fn a_flag_kubelet_extra_args_overrides_is_not_covered() {
    let desired = spec("kubelet:\n  flags: {max-pods: \"250\"}\n", &[]).unwrap();
    let mut obs = observed(TextObs::Absent, text("KUBELET_KUBEADM_ARGS=\"\"\n"));
    let extra = inplace_formats::kubelet::flags::parse(
        "KUBELET_EXTRA_ARGS=\"--max-pods=10\"\n",
        "KUBELET_EXTRA_ARGS",
    )
    .unwrap()
    .unwrap();
    obs.kubelet.extra_args.push(super::observe::EnvFlags {
        file: "/etc/default/kubelet".into(),
        line: 1,
        var: "KUBELET_EXTRA_ARGS".into(),
        flags: extra,
    });
    let p = plan(&[&Kubelet], &desired, &obs, &AppliedRecord::default());
    let c = &p.report.changes[0];
    assert!(!c.covered);
    assert!(
        c.reason.starts_with(
            "--max-pods=10 in /etc/default/kubelet (KUBELET_EXTRA_ARGS) at line 1 comes later"
        ),
        "{}",
        c.reason
    );
    assert!(p.steps.writes.is_empty());
}

#[test]
fn a_config_field_is_edited_in_place_keeping_the_rest() {
    let desired = spec("kubelet:\n  config:\n    maxPods: 250\n", &[]).unwrap();
    let cfg = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nclusterDomain: cluster.local\nmaxPods: 110\n";
    let obs = observed(text(cfg), text("KUBELET_KUBEADM_ARGS=\"\"\n"));
    let p = plan(&[&Kubelet], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["kubelet.config.maxPods"]);
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert_eq!((c.before.as_str(), c.after.as_str()), ("110", "250"));
    let w = p.steps.writes.iter().find(|w| w.path == CONFIG).unwrap();
    let t = String::from_utf8(w.content.clone()).unwrap();
    assert!(
        t.contains("maxPods: 250") && t.contains("clusterDomain: cluster.local"),
        "{t}"
    );
    assert!(
        p.record
            .kubelet_config
            .contains_key("kubelet.config.maxPods")
    );
}

#[test]
fn a_config_file_that_can_not_be_read_covers_no_field() {
    let desired = spec("kubelet:\n  config:\n    maxPods: 250\n", &[]).unwrap();
    let obs = observed(
        TextObs::Problem(format!("{CONFIG} is a symlink")),
        text("KUBELET_KUBEADM_ARGS=\"\"\n"),
    );
    let p = plan(&[&Kubelet], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["kubelet.config.maxPods"]);
    assert!(!p.report.changes[0].covered);
    assert!(p.report.changes[0].reason.contains("is a symlink"));
    assert!(p.steps.writes.is_empty());
}

#[test]
fn a_dropped_flag_gets_its_prior_value_back() {
    let record = AppliedRecord {
        kubelet_flags: [(
            "max-pods".to_string(),
            ManagedValue {
                value: "250".into(),
                prior: Some("110".into()),
            },
        )]
        .into(),
        ..Default::default()
    };
    let obs = observed(
        TextObs::Absent,
        text("KUBELET_KUBEADM_ARGS=\"--max-pods=250\"\n"),
    );
    let p = plan(&[&Kubelet], &NodeSpec::default(), &obs, &record);
    assert_eq!(ids(&p), ["kubelet.flags[max-pods]"]);
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert_eq!((c.before.as_str(), c.after.as_str()), ("250", "110"));
    let t = String::from_utf8(p.steps.writes[0].content.clone()).unwrap();
    assert!(t.contains("--max-pods=110"), "{t}");
    assert!(p.record.kubelet_flags.is_empty());
}

/// A CPU manager policy change resets the manager's checkpoint in place of the kubelet's
/// restart, and the restart is gated by the kubelet's health; a flag that needs no reset
/// gets only the gate.
#[test]
fn a_manager_policy_change_plans_the_checkpoint_reset_and_the_health_gate() {
    use super::effects::{HealthGate, ResetCheckpoints};
    use crate::sections::kit::effect::Stage;
    let desired = spec("kubelet:\n  flags: {cpu-manager-policy: static}\n", &[]).unwrap();
    let obs = observed(TextObs::Absent, text("KUBELET_KUBEADM_ARGS=\"\"\n"));
    let p = plan(&[&Kubelet], &desired, &obs, &AppliedRecord::default());
    let resets: Vec<&ResetCheckpoints> = p.steps.effects_of().collect();
    assert_eq!(resets.len(), 1);
    assert_eq!(resets[0].unit, "kubelet.service");
    assert!(
        resets[0]
            .files
            .iter()
            .any(|f| f.ends_with("cpu_manager_state")),
        "{:?}",
        resets[0].files
    );
    assert_eq!(
        p.steps
            .at(&Stage::Restart("kubelet.service".into()))
            .count(),
        1
    );
    assert_eq!(p.steps.effects_of::<HealthGate>().count(), 1);

    let desired = spec("kubelet:\n  flags: {max-pods: \"250\"}\n", &[]).unwrap();
    let p = plan(&[&Kubelet], &desired, &obs, &AppliedRecord::default());
    assert_eq!(p.steps.effects_of::<ResetCheckpoints>().count(), 0);
    assert_eq!(p.steps.at(&Stage::Gate).count(), 1);

    // nothing to change, nothing restarted: no gate
    let p = plan(
        &[&Kubelet],
        &spec("", &[]).unwrap(),
        &obs,
        &AppliedRecord::default(),
    );
    assert!(p.steps.effects.is_empty());
}

/// The checkpoint reset stops the kubelet, removes the checkpoints there are, starts it;
/// the gate passes on a healthy kubelet and says so again after a rollback.
#[test]
fn the_checkpoint_reset_and_the_health_gate_act_on_the_kubelet() {
    use super::effects::{HealthGate, ResetCheckpoints};
    use crate::sections::kit::effect::Effect;
    use crate::sections::kit::tests::{Reported, sysroot, with_node};
    let state = "/var/lib/kubelet/cpu_manager_state";
    let (_dir, root) = sysroot(&[(state, "{}")]);
    let rec = inplace_node::system::Recorder::default();
    let reset = ResetCheckpoints {
        unit: "kubelet.service".into(),
        files: [state, "/var/lib/kubelet/memory_manager_state"]
            .map(String::from)
            .into(),
    };
    let mut r = Reported::default();
    with_node(&root, &rec, |n| reset.apply(n, &mut r)).unwrap();
    assert_eq!(
        rec.calls(),
        ["stop kubelet.service", "start kubelet.service"]
    );
    assert_eq!(
        r.actions,
        [
            "stopped kubelet.service",
            &format!("removed {state}"),
            "started kubelet.service"
        ]
    );
    assert!(root.read_string(state).unwrap().is_none());
    // the unit's state before, then the removed checkpoint, each undone on rollback
    use crate::sections::kit::effect::{UndoEntry, UnitAction, UnitTouched};
    let [UndoEntry::Unit(touched), UndoEntry::Step(restore)] = &r.undo[..] else {
        panic!("{:?}", r.undo)
    };
    assert_eq!(
        touched,
        &UnitTouched {
            unit: "kubelet.service".into(),
            action: UnitAction::Restart,
            active_before: None,
        }
    );
    assert_eq!(restore.describe(), format!("restored {state}"));
    with_node(&root, &rec, |n| restore.undo(n)).unwrap();
    assert_eq!(root.read_string(state).unwrap().as_deref(), Some("{}"));

    let mut r = Reported::default();
    with_node(&root, &rec, |n| HealthGate.apply(n, &mut r)).unwrap();
    assert_eq!(r.actions, ["kubelet healthy"]);
    assert_eq!(
        HealthGate.announce(),
        Some("waiting for the kubelet to be healthy")
    );
    assert_eq!(
        with_node(&root, &rec, |n| HealthGate.recheck(n)).as_deref(),
        Some("the kubelet is healthy again")
    );
}
