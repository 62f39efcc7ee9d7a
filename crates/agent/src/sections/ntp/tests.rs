//! The `ntp` section: its spec part (servers validated, set once, clashes with `files`
//! items named) and its planning as a pure function of desired, observed and applied.

use super::Ntp;
use crate::sections::kit::observe::FileObs;
use crate::sections::kit::tests::{file, ids, plan, spec};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::{AppliedRecord, ManagedFile, Original};
use inplace_formats::ntp::{CHRONY_RHEL, TIMESYNCD_DROPIN, TIMESYNCD_UNIT};
use inplace_wire::pb::DisruptionLevel;

#[test]
fn ntp_servers_are_validated() {
    let e = spec("ntp:\n  servers: [a, \"b c\"]\n", &[]).unwrap_err();
    assert_eq!(e.field, "ntp.servers[1]");
    assert!(e.message.contains("whitespace"), "{e}");
    let e = spec("ntp:\n  servers: [\"\"]\n", &[]).unwrap_err();
    assert_eq!(e.field, "ntp.servers[0]");
    assert!(e.message.starts_with("server is empty"), "{e}");
    // no server: not managed, and hashed as a spec without ntp
    let empty = spec("ntp:\n  servers: []\n", &[]).unwrap();
    assert_eq!(empty.ntp, None);
    assert_eq!(empty.hash(), NodeSpec::default().hash());
}

#[test]
fn a_file_at_the_ntp_path_names_both() {
    let e = spec(
        "ntp:\n  servers: [a]\nfiles:\n- path: /etc/chrony.conf\n",
        &[],
    )
    .unwrap_err();
    assert_eq!(e.field, "files[0].path");
    assert!(e.message.contains("ntp"), "{e}");
    let e = spec(
        "ntp:\n  servers: [a]\n",
        &[(
            "10-t.yaml",
            "files:\n- path: /etc/systemd/timesyncd.conf.d/inplaced-ntp.conf\n",
        )],
    )
    .unwrap_err();
    assert_eq!(e.field, "dropins[10-t.yaml].files[0].path");
    assert!(e.message.contains("(ntp)"), "{e}");
}

#[test]
fn ntp_is_set_by_one_source_only() {
    let e = spec(
        "ntp:\n  servers: [a]\n",
        &[("a.yaml", "ntp:\n  servers: [a]\n")],
    )
    .unwrap_err();
    assert_eq!(e.field, "dropins[a.yaml].ntp");
    assert_eq!(e.message, "ntp is already set by ntp; set it once");
    let s = spec("", &[("a.yaml", "ntp:\n  servers: [n1, n2]\n")]).unwrap();
    assert_eq!(s.ntp.unwrap().servers, ["n1", "n2"]);
}

fn observed(daemon: Result<inplace_formats::ntp::Daemon, String>, at: Option<FileObs>) -> Observed {
    let mut obs = Observed::empty();
    if let (Ok(d), Some(f)) = (&daemon, at) {
        obs.files.insert(d.path.to_string(), f);
    }
    obs.ntp = Some(daemon);
    obs
}

#[test]
fn timesyncd_gets_the_agents_drop_in_and_a_restart() {
    let desired = spec("ntp:\n  servers: [n1, n2]\n", &[]).unwrap();
    let daemon = inplace_formats::ntp::detect(|p| p == "/etc/systemd/timesyncd.conf");
    let obs = observed(daemon, Some(FileObs::Absent));
    let p = plan(&[&Ntp], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["ntp"]);
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert_eq!(c.disruption.as_ref().unwrap().units, [TIMESYNCD_UNIT]);
    assert_eq!(p.steps.writes.len(), 1);
    assert_eq!(p.steps.writes[0].path, TIMESYNCD_DROPIN);
    assert_eq!(
        p.steps.writes[0].content,
        inplace_formats::ntp::timesyncd_dropin(&desired.ntp.as_ref().unwrap().servers).as_bytes()
    );
    assert!(p.steps.restarts.contains(TIMESYNCD_UNIT));
    assert_eq!(
        p.record.files[TIMESYNCD_DROPIN].item.as_deref(),
        Some("ntp")
    );
}

#[test]
fn chrony_is_edited_in_place_keeping_its_other_lines_and_owner() {
    let desired = spec("ntp:\n  servers: [n1]\n", &[]).unwrap();
    let daemon = inplace_formats::ntp::detect(|p| p == CHRONY_RHEL);
    let conf = "pool old.example.com iburst\ndriftfile /var/lib/chrony/drift\n";
    let obs = observed(daemon, Some(file(conf, 0o640, 0, 38)));
    let p = plan(&[&Ntp], &desired, &obs, &AppliedRecord::default());
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert!(
        c.reason.contains("server and pool lines are replaced"),
        "{}",
        c.reason
    );
    let w = &p.steps.writes[0];
    let text = String::from_utf8(w.content.clone()).unwrap();
    assert!(text.contains("driftfile /var/lib/chrony/drift"), "{text}");
    assert!(!text.contains("old.example.com"), "{text}");
    assert!(text.contains("n1"), "{text}");
    assert_eq!((w.mode, w.uid, w.gid), (0o640, 0, 38));
}

#[test]
fn no_time_daemon_is_not_covered_and_writes_nothing() {
    let desired = spec("ntp:\n  servers: [n1]\n", &[]).unwrap();
    let obs = observed(inplace_formats::ntp::detect(|_| false), None);
    let p = plan(&[&Ntp], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["ntp"]);
    let c = &p.report.changes[0];
    assert!(!c.covered);
    assert!(c.reason.starts_with("no time daemon found"), "{}", c.reason);
    assert!(p.steps.writes.is_empty());
}

#[test]
fn a_dropped_ntp_file_is_reverted_with_a_restart() {
    let record = AppliedRecord {
        files: [(
            TIMESYNCD_DROPIN.to_string(),
            ManagedFile {
                sha256: "sha256:x".into(),
                mode: 0o644,
                uid: 0,
                gid: 0,
                original: Original::Absent,
                created_dirs: Vec::new(),
                item: Some("ntp".into()),
            },
        )]
        .into(),
        ..Default::default()
    };
    let mut obs = Observed::empty();
    obs.files.insert(
        TIMESYNCD_DROPIN.into(),
        file("[Time]\nNTP=n1\n", 0o644, 0, 0),
    );
    let p = plan(&[&Ntp], &NodeSpec::default(), &obs, &record);
    assert_eq!(p.steps.removes.len(), 1, "{:?}", p.steps);
    assert_eq!(p.steps.removes[0].path, TIMESYNCD_DROPIN);
    let d = p.report.changes[0].disruption.as_ref().unwrap();
    assert_eq!(d.level, DisruptionLevel::Restart as i32);
    assert_eq!(d.units, [TIMESYNCD_UNIT]);
    assert!(!p.record.files.contains_key(TIMESYNCD_DROPIN));
}
