//! The `files` section: its spec part (path, mode and owner rules naming the field, each
//! path from one source) and its planning through the file machinery.

use super::Files;
use super::spec::owner_refs;
use crate::sections::kit::observe::FileObs;
use crate::sections::kit::tests::{file, ids, plan, spec};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::{AppliedRecord, ManagedFile, Original};
use inplace_node::accounts::IdRef;
use inplace_wire::pb;
use inplace_wire::pb::ChangeOperation;

fn one_file(f: pb::File) -> Result<NodeSpec, inplace_wire::names::SpecError> {
    NodeSpec::from_pb(&pb::NodeSpec {
        files: vec![f],
        ..Default::default()
    })
}

fn at(path: &str) -> pb::File {
    pb::File {
        path: path.into(),
        ..Default::default()
    }
}

#[test]
fn path_errors_name_the_field() {
    let long_name = format!("/etc/{}", "x".repeat(256));
    let long_path = "/etc".to_string() + &"/abcdefgh".repeat(512);
    for (p, want) in [
        ("", "files[0].path: path is empty"),
        ("etc/x", "files[0].path: path \"etc/x\" is relative"),
        (
            "/etc/../x",
            "files[0].path: path \"/etc/../x\" is not normalized",
        ),
        (
            "/etc/a\nb",
            "files[0].path: path contains a control character",
        ),
        (
            "/proc/sys/vm/x",
            "files[0].path: /proc/sys/vm/x is under /proc",
        ),
        ("/dev", "files[0].path: /dev is under /dev"),
        ("/", "files[0].path: path is the root directory"),
        (
            &long_name,
            "files[0].path: path component \"xxxxxxxxxxxxxxxx\"... is 256 bytes",
        ),
        (&long_path, "files[0].path: path is 4612 bytes"),
    ] {
        let e = one_file(at(p)).unwrap_err().to_string();
        assert!(e.starts_with(want), "{p:?}: {e}");
    }
}

#[test]
fn mode_owner_and_group_errors_name_the_field() {
    let e = one_file(pb::File {
        mode: Some(0o17777),
        ..at("/etc/x")
    })
    .unwrap_err();
    assert_eq!(e.field, "files[0].mode");
    for (owner, group, field) in [
        ("a:b", "c", "files[0].group"),
        ("a:", "", "files[0].owner"),
        ("4294967295", "", "files[0].owner"),
        ("a b", "", "files[0].owner"),
        ("a", "g/x", "files[0].group"),
    ] {
        let e = one_file(pb::File {
            owner: owner.into(),
            group: group.into(),
            ..at("/etc/x")
        })
        .unwrap_err();
        assert_eq!(e.field, field, "{owner:?} {group:?}: {e}");
    }
}

#[test]
fn owner_forms() {
    assert_eq!(
        owner_refs("f", "etcd:etcd", "").unwrap(),
        (
            Some(IdRef::Name("etcd".into())),
            Some(IdRef::Name("etcd".into()))
        )
    );
    assert_eq!(
        owner_refs("f", "997", "0").unwrap(),
        (Some(IdRef::Id(997)), Some(IdRef::Id(0)))
    );
    assert_eq!(owner_refs("f", "", "").unwrap(), (None, None));
    assert!(owner_refs("f", "a:b", "c").is_err());
}

#[test]
fn a_path_is_written_by_one_source_only() {
    let e = spec("files:\n- path: /etc/x\n- path: /etc/x\n", &[]).unwrap_err();
    assert_eq!(e.field, "files[1].path");
    assert!(e.message.contains("files[0]"), "{e}");
    let e = spec(
        "files:\n- path: /etc/x\n",
        &[("a.yaml", "files:\n- path: /etc/x\n")],
    )
    .unwrap_err();
    assert_eq!(e.field, "dropins[a.yaml].files[0].path");
    assert_eq!(
        e.message,
        "/etc/x is also written by files[0]; give each path once"
    );
    // items of the spec come first, then each drop-in's, in name order
    let s = spec(
        "files:\n- path: /etc/a\n",
        &[
            ("2.yaml", "files:\n- path: /etc/c\n"),
            ("1.yaml", "files:\n- path: /etc/b\n"),
        ],
    )
    .unwrap();
    let paths: Vec<&str> = s.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["/etc/a", "/etc/b", "/etc/c"]);
    assert_eq!(s.files[0].mode, super::spec::DEFAULT_FILE_MODE);
}

#[test]
fn a_new_file_is_created_with_its_mode_and_owner() {
    let desired = spec(
        "files:\n- path: /etc/x\n  content: hi\n  mode: \"0600\"\n  owner: \"7:8\"\n",
        &[],
    )
    .unwrap();
    let mut obs = Observed::empty();
    obs.files.insert("/etc/x".into(), FileObs::Absent);
    let p = plan(&[&Files], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["files[/etc/x]"]);
    let c = &p.report.changes[0];
    assert_eq!(c.operation, ChangeOperation::Create as i32);
    assert!(c.covered, "{}", c.reason);
    let w = &p.steps.writes[0];
    assert_eq!(
        (w.content.as_slice(), w.mode, w.uid, w.gid),
        (&b"hi"[..], 0o600, 7, 8)
    );
    let m = &p.record.files["/etc/x"];
    assert_eq!(m.original, Original::Absent);
    assert_eq!(m.item, None);
}

#[test]
fn an_overwritten_file_has_its_original_saved() {
    let desired = spec("files:\n- path: /etc/x\n  content: hi\n", &[]).unwrap();
    let mut obs = Observed::empty();
    obs.files
        .insert("/etc/x".into(), file("old\n", 0o644, 0, 0));
    let p = plan(&[&Files], &desired, &obs, &AppliedRecord::default());
    assert_eq!(
        p.report.changes[0].operation,
        ChangeOperation::Update as i32
    );
    let w = &p.steps.writes[0];
    assert_eq!(w.save_original.as_deref(), Some(&b"old\n"[..]));
    assert!(matches!(
        p.record.files["/etc/x"].original,
        Original::Saved { .. }
    ));
}

#[test]
fn a_file_already_as_desired_is_no_change() {
    let desired = spec("files:\n- path: /etc/x\n  content: hi\n", &[]).unwrap();
    let mut obs = Observed::empty();
    obs.files.insert("/etc/x".into(), file("hi", 0o644, 0, 0));
    let p = plan(&[&Files], &desired, &obs, &AppliedRecord::default());
    assert!(p.report.changes.is_empty(), "{:?}", p.report.changes);
    assert!(p.steps.writes.is_empty());
    assert_eq!(p.record.files["/etc/x"].original, Original::Unchanged);
}

#[test]
fn a_dropped_file_the_agent_created_is_deleted() {
    let record = AppliedRecord {
        files: [(
            "/etc/x".to_string(),
            ManagedFile {
                sha256: format!("sha256:{}", inplace_node::digest::sha256_hex(b"hi")),
                mode: 0o644,
                uid: 0,
                gid: 0,
                original: Original::Absent,
                created_dirs: Vec::new(),
                item: None,
            },
        )]
        .into(),
        ..Default::default()
    };
    let mut obs = Observed::empty();
    obs.files.insert("/etc/x".into(), file("hi", 0o644, 0, 0));
    let p = plan(&[&Files], &NodeSpec::default(), &obs, &record);
    assert_eq!(ids(&p), ["files[/etc/x]"]);
    assert_eq!(
        p.report.changes[0].operation,
        ChangeOperation::Delete as i32
    );
    assert_eq!(p.steps.removes[0].path, "/etc/x");
    assert!(p.record.files.is_empty());
}
