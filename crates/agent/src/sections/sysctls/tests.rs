//! The `sysctls` section: its spec part (keys and values validated, one kernel parameter
//! per spelling, merge rules, hash) and its planning as a pure function of the desired
//! keys, the live values and sysctl.d files observed, and the applied record.

use super::Sysctls;
use super::observe::{SysctlLive, SysctlObs};
use crate::config::Config;
use crate::sections::kit::observe::TextObs;
use crate::sections::kit::tests::{ids, plan, spec};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::{AppliedRecord, ManagedValue};
use inplace_wire::pb;
use inplace_wire::pb::ChangeOperation;

#[test]
fn keys_and_values_are_validated_naming_the_field() {
    for (yaml, field, says) in [
        (
            "sysctls: {vm..x: \"1\"}\n",
            "sysctls[vm..x]",
            "is not valid",
        ),
        (
            "sysctls: {\"net.*.x\": \"1\"}\n",
            "sysctls[net.*.x]",
            "is not valid",
        ),
        (
            "sysctls: {.vm.x: \"1\"}\n",
            "sysctls[.vm.x]",
            "is not valid",
        ),
        (
            "sysctls: {vm.x: \"\"}\n",
            "sysctls[vm.x]",
            "non-empty single line",
        ),
        (
            "sysctls: {vm.x: \"a\\nb\"}\n",
            "sysctls[vm.x]",
            "non-empty single line",
        ),
    ] {
        let e = spec(yaml, &[]).unwrap_err();
        assert_eq!(e.field, field, "{yaml}");
        assert!(e.message.contains(says), "{e}");
    }
}

#[test]
fn one_kernel_parameter_is_named_once_whatever_its_spelling() {
    let e = spec(
        "sysctls: {net.ipv4.ip_forward: \"1\", net/ipv4/ip_forward: \"1\"}\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(e.field, "sysctls[net/ipv4/ip_forward]");
    assert!(e.message.contains("sysctls[net.ipv4.ip_forward]"), "{e}");
    let e = spec(
        "sysctls: {net.ipv4.ip_forward: \"1\"}\n",
        &[("a.yaml", "sysctls: {net/ipv4/ip_forward: \"1\"}\n")],
    )
    .unwrap_err();
    assert_eq!(e.field, "dropins[a.yaml].sysctls[net/ipv4/ip_forward]");
    assert!(e.message.contains("with one spelling"), "{e}");
}

#[test]
fn sources_may_repeat_a_value_but_not_change_it() {
    let e = spec(
        "sysctls: {vm.swappiness: \"1\"}\n",
        &[("a.yaml", "sysctls: {vm.swappiness: \"2\"}\n")],
    )
    .unwrap_err();
    assert_eq!(e.field, "dropins[a.yaml].sysctls[vm.swappiness]");
    assert_eq!(
        e.message,
        "sysctls[vm.swappiness] sets the same kernel parameter (/proc/sys/vm/swappiness) to \"1\"; set it once, with one spelling"
    );
    let e = spec("", &[("a.yaml", "sysctls: {vm.swappiness: \"\"}\n")]).unwrap_err();
    assert_eq!(e.field, "dropins[a.yaml].sysctls[vm.swappiness]");
    let s = spec(
        "sysctls: {vm.swappiness: \"1\"}\n",
        &[("a.yaml", "sysctls: {vm.swappiness: \"1\", vm.x: \"2\"}\n")],
    )
    .unwrap();
    assert_eq!(s.sysctls.len(), 2);
}

#[test]
fn hash_ignores_map_order_but_not_values() {
    let mut a = pb::NodeSpec::default();
    a.sysctls.insert("a.b".into(), "1".into());
    a.sysctls.insert("c.d".into(), "2".into());
    let h1 = NodeSpec::from_pb(&a).unwrap().hash();
    let mut b = a.clone();
    b.sysctls.insert("c.d".into(), "3".into());
    assert_ne!(h1, NodeSpec::from_pb(&b).unwrap().hash());
    assert_eq!(h1, NodeSpec::from_pb(&a.clone()).unwrap().hash());
    assert!(h1.starts_with("sha256:"));
}

fn live(value: &str, writable: bool) -> Option<SysctlLive> {
    Some(SysctlLive {
        value: value.into(),
        writable,
        unknown: None,
    })
}

/// The node with `live` values, the agent's drop-in holding `drop_in` (None: absent) and
/// the sysctl.d files `files` (path, text).
fn observed(
    live: &[(&str, Option<SysctlLive>)],
    drop_in: Option<&str>,
    files: &[(&str, &str)],
) -> Observed {
    let e = inplace_node::sysroot::Entry {
        kind: inplace_node::sysroot::Kind::File,
        mode: 0o644,
        uid: 0,
        gid: 0,
        len: 0,
    };
    let mut obs = Observed::empty();
    obs.sysctls = SysctlObs {
        live: live
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        drop_in: Some(drop_in.map_or(TextObs::Absent, |t| TextObs::Text(t.into(), e))),
        files: files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect(),
        unreadable: Vec::new(),
        targets: Default::default(),
    };
    obs
}

fn drop_in() -> String {
    Config::default().sysctl.drop_in
}

#[test]
fn a_new_key_is_written_live_and_persisted_with_its_prior_recorded() {
    let desired = spec("sysctls: {vm.swappiness: \"10\"}\n", &[]).unwrap();
    let obs = observed(&[("vm.swappiness", live("60", true))], None, &[]);
    let p = plan(&[&Sysctls], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["sysctls[vm.swappiness]"]);
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert_eq!((c.before.as_str(), c.after.as_str()), ("60", "10"));
    assert_eq!(live_writes(&p), [("vm.swappiness".into(), "10".into())]);
    assert_eq!(p.steps.writes.len(), 1);
    assert_eq!(p.steps.writes[0].path, drop_in());
    let text = String::from_utf8(p.steps.writes[0].content.clone()).unwrap();
    assert!(text.contains("vm.swappiness = 10"), "{text}");
    assert_eq!(
        p.record.sysctls["vm.swappiness"],
        ManagedValue {
            value: "10".into(),
            prior: Some("60".into())
        }
    );
}

#[test]
fn a_key_live_and_persisted_already_is_no_change() {
    let desired = spec("sysctls: {vm.swappiness: \"10\"}\n", &[]).unwrap();
    let obs = observed(
        &[("vm.swappiness", live("10", true))],
        Some("vm.swappiness = 10\n"),
        &[],
    );
    let p = plan(&[&Sysctls], &desired, &obs, &AppliedRecord::default());
    assert!(p.report.changes.is_empty(), "{:?}", p.report.changes);
    assert!(live_writes(&p).is_empty() && p.steps.writes.is_empty());
    assert!(p.record.sysctls.contains_key("vm.swappiness"));
}

#[test]
fn a_key_that_can_not_be_set_is_not_covered() {
    let desired = spec("sysctls: {vm.nope: \"1\", vm.ro: \"1\"}\n", &[]).unwrap();
    let obs = observed(&[("vm.nope", None), ("vm.ro", live("0", false))], None, &[]);
    let p = plan(&[&Sysctls], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["sysctls[vm.nope]", "sysctls[vm.ro]"]);
    assert!(p.report.changes[0].reason.contains("does not exist"));
    assert!(p.report.changes[1].reason.contains("is read-only"));
    assert!(p.report.changes.iter().all(|c| !c.covered));
    assert!(live_writes(&p).is_empty());
    assert!(p.record.sysctls.is_empty());
}

#[test]
fn a_later_sysctl_d_file_that_wins_at_boot_is_named() {
    let desired = spec("sysctls: {vm.swappiness: \"10\"}\n", &[]).unwrap();
    let late = "/etc/sysctl.d/99-zz.conf";
    let obs = observed(
        &[("vm.swappiness", live("60", true))],
        None,
        &[(late, "vm.swappiness = 1\n")],
    );
    let p = plan(&[&Sysctls], &desired, &obs, &AppliedRecord::default());
    let c = &p.report.changes[0];
    assert!(!c.covered);
    assert!(c.reason.starts_with(late), "{}", c.reason);
}

#[test]
fn a_dropped_key_gets_its_prior_value_back_and_leaves_the_drop_in() {
    let record = AppliedRecord {
        sysctls: [(
            "vm.swappiness".to_string(),
            ManagedValue {
                value: "10".into(),
                prior: Some("60".into()),
            },
        )]
        .into(),
        ..Default::default()
    };
    // the drop-in as the agent wrote it: its header and the line
    let text = inplace_formats::sysctl::render_sysctl_conf(
        &record
            .sysctls
            .iter()
            .map(|(k, m)| (k.clone(), m.value.clone()))
            .collect(),
    );
    let obs = observed(&[("vm.swappiness", live("10", true))], Some(&text), &[]);
    let p = plan(&[&Sysctls], &NodeSpec::default(), &obs, &record);
    assert_eq!(ids(&p), ["sysctls[vm.swappiness]"]);
    let c = &p.report.changes[0];
    assert_eq!(c.operation, ChangeOperation::Delete as i32);
    assert_eq!(c.after, "60");
    assert_eq!(live_writes(&p), [("vm.swappiness".into(), "60".into())]);
    assert_eq!(p.steps.removes.len(), 1);
    assert_eq!(p.steps.removes[0].path, drop_in());
    assert!(p.record.sysctls.is_empty());
}

/// The live writes a plan's steps hold: key, value, in order.
fn live_writes(p: &crate::plan::Plan) -> Vec<(String, String)> {
    p.steps
        .effects_of::<super::effects::SetSysctl>()
        .map(|s| (s.key.clone(), s.value.clone()))
        .collect()
}

/// The live write: journaled with the value before, written, read back, listed, its undo
/// (and the journal's, after a crash) writing the value before again.
#[test]
fn the_live_write_is_journaled_read_back_and_undone() {
    use super::effects::SetSysctl;
    use crate::sections::kit::effect::{Effect, Stage, UndoEntry};
    use crate::sections::kit::tests::{Reported, sysroot, with_node};
    use crate::state::EffectEntry;
    let (_dir, root) = sysroot(&[("/proc/sys/vm/swappiness", "60\n")]);
    let rec = inplace_node::system::Recorder::default();
    let set = SetSysctl {
        key: "vm.swappiness".into(),
        value: "10".into(),
    };
    assert_eq!(set.stage(), Stage::AfterFiles);
    let entry = with_node(&root, &rec, |n| set.journal_entry(n)).unwrap();
    assert_eq!(
        entry,
        EffectEntry::Sysctl {
            key: "vm.swappiness".into(),
            prior: "60".into()
        }
    );
    let mut r = Reported::default();
    with_node(&root, &rec, |n| set.apply(n, &mut r)).unwrap();
    let live = || {
        root.read_string("/proc/sys/vm/swappiness")
            .unwrap()
            .unwrap()
    };
    assert_eq!(live(), "10\n");
    assert_eq!(r.actions, ["set sysctl vm.swappiness (live)"]);
    let [UndoEntry::Step(undo)] = &r.undo[..] else {
        panic!("{:?}", r.undo)
    };
    with_node(&root, &rec, |n| undo.undo(n)).unwrap();
    assert_eq!(live(), "60\n");
    // after a crash, from the journal's entry
    with_node(&root, &rec, |n| set.apply(n, &mut Reported::default())).unwrap();
    let UndoEntry::Step(journaled) = crate::sections::journaled_undo(&entry) else {
        panic!("a sysctl's journal entry is undone in reverse, not re-run")
    };
    with_node(&root, &rec, |n| journaled.undo(n)).unwrap();
    assert_eq!(live(), "60\n");
    assert!(rec.calls().is_empty());
}
