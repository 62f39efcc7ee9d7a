//! The `dropins` section: its spec part (names validated, sorted, hashed only when
//! present) and its planning: kept in node.d as the agent's own files, without
//! disruption, with a mode the agent may obey kept.

use super::Dropins;
use crate::sections::kit::tests::{file, ids, plan, spec};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::{AppliedRecord, ManagedFile, Original};
use inplace_wire::pb::DisruptionLevel;

#[test]
fn dropin_names_are_validated() {
    for (bad, field) in [
        ("x.yml", "dropins[0].name"),
        ("../x.yaml", "dropins[0].name"),
        (".yaml", "dropins[0].name"),
        ("a b.yaml", "dropins[0].name"),
    ] {
        let e = spec("", &[(bad, "")]).unwrap_err();
        assert_eq!(e.field, field, "{bad}: {e}");
    }
    let e = spec("", &[("a.yaml", ""), ("a.yaml", "")]).unwrap_err();
    assert_eq!(e.field, "dropins[1].name");
    assert!(e.message.contains("dropins[0]"), "{e}");
}

#[test]
fn keep_is_the_agents_to_resolve() {
    let mut p = inplace_wire::yaml::parse("").unwrap();
    p.dropins.push(inplace_wire::pb::DropIn {
        name: "a.yaml".into(),
        content: String::new(),
        keep: true,
    });
    let e = NodeSpec::from_pb(&p).unwrap_err();
    assert_eq!(e.field, "dropins[0].keep");
}

#[test]
fn dropins_are_kept_sorted_by_name_and_hashed_only_when_present() {
    let s = spec("", &[("20-b.yaml", ""), ("10-a.yaml", "")]).unwrap();
    let names: Vec<&str> = s.dropins.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["10-a.yaml", "20-b.yaml"]);
    assert_eq!(s.dropins[0].path(), "/etc/inplaced/node.d/10-a.yaml");
    assert_eq!(s.dropins[0].sha256, inplace_node::digest::sha256_hex(b""));
    // empty drop-ins change nothing but the hash
    assert_ne!(s.hash(), NodeSpec::default().hash());
    assert_eq!(spec("", &[]).unwrap().hash(), NodeSpec::default().hash());
}

#[test]
fn a_dropin_is_written_as_the_agents_own_file_without_disruption() {
    let desired = spec("", &[("10-a.yaml", "sysctls: {vm.swappiness: \"1\"}\n")]).unwrap();
    let p = plan(
        &[&Dropins],
        &desired,
        &Observed::empty(),
        &AppliedRecord::default(),
    );
    assert_eq!(ids(&p), ["dropins[10-a.yaml]"]);
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert_eq!(
        c.disruption.as_ref().unwrap().level,
        DisruptionLevel::None as i32
    );
    let w = &p.steps.writes[0];
    assert_eq!(w.path, "/etc/inplaced/node.d/10-a.yaml");
    assert_eq!(w.mode, 0o644);
    assert_eq!(
        p.record.files[&w.path].item.as_deref(),
        Some("dropins[10-a.yaml]")
    );
}

#[test]
fn a_dropins_mode_is_kept_only_when_the_agent_may_obey_it() {
    let desired = spec("", &[("10-a.yaml", "")]).unwrap();
    let path = "/etc/inplaced/node.d/10-a.yaml";
    for (mode, uid, kept) in [(0o600, 0, 0o600), (0o664, 0, 0o644), (0o600, 4242, 0o644)] {
        let mut obs = Observed::empty();
        obs.files.insert(path.into(), file("x: 1\n", mode, uid, 0));
        let p = plan(&[&Dropins], &desired, &obs, &AppliedRecord::default());
        let w = p.steps.writes.iter().find(|w| w.path == path);
        assert_eq!(w.map(|w| w.mode), Some(kept), "{mode:o} uid {uid}");
    }
}

#[test]
fn a_dropped_dropin_is_deleted_without_disruption() {
    let path = "/etc/inplaced/node.d/10-a.yaml";
    let record = AppliedRecord {
        files: [(
            path.to_string(),
            ManagedFile {
                sha256: format!("sha256:{}", inplace_node::digest::sha256_hex(b"")),
                mode: 0o644,
                uid: 0,
                gid: 0,
                original: Original::Absent,
                created_dirs: Vec::new(),
                item: Some("dropins[10-a.yaml]".into()),
            },
        )]
        .into(),
        ..Default::default()
    };
    let mut obs = Observed::empty();
    obs.files.insert(path.into(), file("", 0o644, 0, 0));
    let p = plan(&[&Dropins], &NodeSpec::default(), &obs, &record);
    assert_eq!(p.steps.removes.len(), 1);
    assert_eq!(p.steps.removes[0].path, path);
    assert_eq!(
        p.report.changes[0].disruption.as_ref().unwrap().level,
        DisruptionLevel::None as i32
    );
}
