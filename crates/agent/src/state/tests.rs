//! The state directory store: atomic writes, the record and spec round trips, the lock,
//! originals, quarantine, the seal's bytes.

use std::collections::BTreeMap;

use super::*;

fn open() -> (tempfile::TempDir, StateDir) {
    let d = tempfile::tempdir().unwrap();
    let s = StateDir::open(&d.path().join("state")).unwrap();
    (d, s)
}

/// Every name in `dir` (recursively), relative to it, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

fn record() -> AppliedRecord {
    let mut files = BTreeMap::new();
    files.insert(
        "/etc/a".to_string(),
        ManagedFile {
            sha256: sha256_of(b"new"),
            mode: 0o644,
            uid: 0,
            gid: 0,
            original: Original::Saved {
                backup: backup_name("/etc/a"),
                sha256: sha256_of(b"old"),
                mode: 0o600,
                uid: 1,
                gid: 2,
            },
            created_dirs: vec!["/etc/x".into()],
            item: None,
        },
    );
    let mut sysctls = BTreeMap::new();
    sysctls.insert(
        "vm.swappiness".to_string(),
        ManagedValue {
            value: "10".to_string(),
            prior: Some("60".to_string()),
        },
    );
    AppliedRecord {
        spec_hash: "sha256:abc".into(),
        files,
        kernel_args: vec!["quiet".into()],
        kernel_args_removed: vec![PendingRemoval {
            arg: "isolcpus=2-7".into(),
            boot_id: "b1".into(),
        }],
        sysctls,
        ..AppliedRecord::default()
    }
}

#[test]
fn open_makes_the_directory_private() {
    use std::os::unix::fs::PermissionsExt;
    let (_d, s) = open();
    let mode = std::fs::metadata(s.path()).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
}

#[test]
fn atomic_writes_leave_no_temporary_file_and_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let (_d, s) = open();
    s.save_record(&record()).unwrap();
    s.save_applied_spec(b"spec").unwrap();
    s.save_original("/etc/a", b"old").unwrap();
    s.save_drift(&DriftBook::default()).unwrap();
    s.probe_writable().unwrap();
    let all = names(s.path());
    assert!(
        all.iter().all(|n| !n.contains(".inplaced-")),
        "temporary file left: {all:?}"
    );
    assert!(!all.contains(&".probe".to_string()), "{all:?}");
    for f in ["applied.json", "applied-spec.pb", "drift.json"] {
        let mode = std::fs::metadata(s.path().join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o600, "{f}");
    }
}

#[test]
fn remove_stale_temps_removes_only_temporary_files() {
    let (_d, s) = open();
    s.save_record(&record()).unwrap();
    let stale = s.path().join(".applied.json.inplaced-1-1.tmp");
    std::fs::write(&stale, b"half").unwrap();
    s.remove_stale_temps().unwrap();
    assert!(!stale.exists());
    assert!(s.path().join("applied.json").exists());
}

#[test]
fn the_record_round_trips() {
    let (_d, s) = open();
    assert_eq!(s.load_record().unwrap(), AppliedRecord::default());
    s.save_record(&record()).unwrap();
    assert_eq!(s.load_record().unwrap(), record());
}

#[test]
fn the_empty_record_keeps_its_bytes() {
    // on-disk format: camelCase, pretty, the optional fields left out when empty
    let (_d, s) = open();
    s.save_record(&AppliedRecord::default()).unwrap();
    let b = std::fs::read_to_string(s.path().join("applied.json")).unwrap();
    assert_eq!(
        b,
        "{\n  \"specHash\": \"\",\n  \"files\": {},\n  \"kubeletConfig\": {},\n  \"kubeletFlags\": {},\n  \"kernelArgs\": [],\n  \"sysctls\": {}\n}"
    );
}

#[test]
fn install_applied_writes_the_record_and_the_sealed_spec() {
    let (_d, s) = open();
    assert_eq!(s.load_applied_spec().unwrap(), None);
    let spec = pb::NodeSpec::default();
    let bytes = prost::Message::encode_to_vec(&spec);
    s.install_applied(&record(), &bytes).unwrap();
    assert_eq!(s.load_record().unwrap(), record());
    assert_eq!(s.load_applied_spec().unwrap(), Some(spec));
    let raw = std::fs::read(s.path().join("applied-spec.pb")).unwrap();
    assert_eq!(raw, seal(&bytes));
    assert!(
        s.check(&record(), false)
            .iter()
            .any(|w| w.contains("saved original"))
    );
}

#[test]
fn a_spec_cut_in_its_header_is_corrupt() {
    let (_d, s) = open();
    std::fs::write(s.path().join("applied-spec.pb"), &SEAL.as_bytes()[..5]).unwrap();
    assert!(matches!(
        s.load_applied_spec(),
        Err(StateError::Corrupt { .. })
    ));
}

#[test]
fn a_corrupt_record_is_moved_aside() {
    let (_d, s) = open();
    std::fs::write(s.path().join("applied.json"), b"{not json").unwrap();
    let (r, why) = s.load_record_or_quarantine().unwrap();
    assert_eq!(r, AppliedRecord::default());
    let why = why.unwrap();
    assert!(why.message.contains("did not parse"));
    let aside: Vec<String> = names(s.path())
        .into_iter()
        .filter(|n| n.starts_with("applied.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1);
    // in its place an empty record naming it: once it is removed, the loss is settled
    let placed: AppliedRecord =
        serde_json::from_slice(&std::fs::read(s.path().join("applied.json")).unwrap()).unwrap();
    assert!(placed.is_empty());
    assert_eq!(placed.lost.as_deref(), Some(aside[0].as_str()));
    // the problem names the file it holds while
    assert_eq!(
        why.file,
        Some(s.path().join(&aside[0]).display().to_string())
    );
}

#[test]
fn the_lock_refuses_a_second_holder() {
    let d = tempfile::tempdir().unwrap();
    let mut first = StateDir::open(d.path()).unwrap();
    first.lock().unwrap();
    let mut second = StateDir::open(d.path()).unwrap();
    match second.lock() {
        Err(StateError::Locked { pid, .. }) => assert_eq!(pid, std::process::id().to_string()),
        other => panic!("second lock: {other:?}"),
    }
    drop(first);
    second.lock().unwrap();
}

#[test]
fn originals_round_trip_under_the_hash_of_their_path() {
    let (_d, s) = open();
    let name = s.save_original("/etc/a", b"old").unwrap();
    assert_eq!(name, backup_name("/etc/a"));
    assert_eq!(name.len(), 64);
    assert_eq!(s.read_original(&name).unwrap(), Some(b"old".to_vec()));
    s.drop_original(&name).unwrap();
    assert_eq!(s.read_original(&name).unwrap(), None);
}

#[test]
fn the_drift_book_round_trips_and_reads_empty_when_damaged() {
    let (_d, s) = open();
    let book = DriftBook {
        detections: 3,
        seen: BTreeMap::from([("files[/etc/a]".to_string(), 17)]),
    };
    s.save_drift(&book).unwrap();
    assert_eq!(s.load_drift(), book);
    std::fs::write(s.path().join("drift.json"), b"[").unwrap();
    assert_eq!(s.load_drift(), DriftBook::default());
    assert!(s.check(&AppliedRecord::default(), false)[0].contains("drift counts"));
}

#[test]
fn the_seal_has_its_header_and_detects_damage() {
    let sealed = seal(b"abc");
    let header = format!("inplaced-sealed {} len=3\n", sha256_of(b"abc"));
    assert_eq!(sealed, [header.as_bytes(), b"abc"].concat());
    assert_eq!(unseal(&sealed).unwrap(), b"abc");
    assert!(unseal(&sealed[..sealed.len() - 1]).is_err());
    let mut altered = sealed.clone();
    *altered.last_mut().unwrap() = b'x';
    assert!(unseal(&altered).unwrap_err().contains("was written"));
    assert!(unseal(b"abc").is_err());
}

fn wire_op(id: &str) -> inplace_wire::pb::Operation {
    inplace_wire::pb::Operation {
        id: id.into(),
        ..Default::default()
    }
}

fn journal_with_pre_image(s: &StateDir, op: &str) -> Intent {
    let file = s.journal_pre_image(op, 0, b"before").unwrap();
    let intent = Intent {
        operation: op.into(),
        entries: vec![IntentEntry {
            path: "/etc/a".into(),
            pre: Some(PreImage {
                file,
                sha256: sha256_of(b"before"),
                len: 6,
                mode: 0o644,
                uid: 0,
                gid: 0,
            }),
            missing_dirs: vec![],
            new_sha256: Some(sha256_of(b"after")),
            restore_over_any: false,
        }],
        version: JOURNAL_VERSION,
        ..Intent::default()
    };
    s.journal_intent(&intent, false).unwrap();
    s.journal_progress(op, "written").unwrap();
    intent
}

#[test]
fn a_journal_reads_back_verified() {
    let (_d, s) = open();
    let intent = journal_with_pre_image(&s, "op1");
    let journals = s.journals().unwrap();
    assert_eq!(journals.len(), 1);
    let (id, j) = &journals[0];
    assert_eq!(id, "op1");
    assert_eq!(j.intent, Sealed::Valid(intent.clone()));
    assert_eq!(j.progress, Sealed::Valid("written".into()));
    assert_eq!(j.committed, None);
    let pre = intent.entries[0].pre.as_ref().unwrap();
    assert_eq!(s.journal_read_pre(2, "op1", pre).unwrap(), b"before");

    s.journal_commit(&wire_op("op1"), b"spec", &record(), 3)
        .unwrap();
    let (_, j) = &s.journals().unwrap()[0];
    assert_eq!(
        j.committed,
        Some(Sealed::Valid(Committed {
            generation: 1,
            record: record(),
            phase: 3,
            spec: b"spec".to_vec(),
            operation: Some(serde_json::to_value(wire_op("op1")).unwrap()),
        }))
    );
    s.journal_remove("op1").unwrap();
    assert!(s.journals().unwrap().is_empty());
}

#[test]
fn a_damaged_intent_is_reported_with_what_it_names() {
    let (_d, s) = open();
    let intent = journal_with_pre_image(&s, "op1");
    let p = s.path().join("journal/op1.intent");
    let mut b = std::fs::read(&p).unwrap();
    b.push(b'\n');
    std::fs::write(&p, b).unwrap();
    let (_, j) = &s.journals().unwrap()[0];
    assert!(matches!(&j.intent, Sealed::Damaged(w) if w.contains("op1.intent")));
    assert_eq!(j.unverified_intent, Some(intent));
}

#[test]
fn a_quarantined_journal_is_moved_whole() {
    let (_d, s) = open();
    journal_with_pre_image(&s, "op1");
    let before = names(&s.path().join("journal"));
    assert_eq!(before, ["op1.intent", "op1.pre-0", "op1.progress"]);
    let to = s.journal_quarantine(2, "op1", "why").unwrap();
    assert!(names(&s.path().join("journal")).is_empty());
    let mut after = names(Path::new(&to));
    after.retain(|n| n != "REPORT");
    assert_eq!(after, before);
    assert_eq!(
        std::fs::read_to_string(Path::new(&to).join("REPORT")).unwrap(),
        "why"
    );
    assert_eq!(s.quarantined(), vec![(to, "why".to_string())]);
}

/// Format 2: the commit outlives its operation as the applied state's source (nothing
/// is installed per operation), the next operation's install removes it, and when a
/// power cut leaves two the highest generation is the applied state.
#[test]
fn a_commit_outlives_its_install_and_the_highest_generation_wins() {
    let (_d, s) = open();
    journal_with_pre_image(&s, "op1");
    s.journal_commit(&wire_op("op1"), b"spec-1", &record(), 3)
        .unwrap();
    s.retire_journal("op1").unwrap();
    assert_eq!(names(&s.path().join("journal")), ["op1.commit"]);
    assert_eq!(s.load_record().unwrap(), record());
    let mut second = record();
    second.spec_hash = "sha256:second".into();
    s.journal_commit(&wire_op("op2"), b"spec-2", &second, 3)
        .unwrap();
    // a power cut before op2's install: both commits, op2's is newer
    let pending = s.pending_commit().unwrap().unwrap();
    assert_eq!((pending.generation, pending.spec), (2, b"spec-2".to_vec()));
    // the record, the phase and the operation read back as written
    assert_eq!((pending.record, pending.phase), (second.clone(), 3));
    assert_eq!(
        pending.operation.as_ref().and_then(|o| o["id"].as_str()),
        Some("op2")
    );
    assert_eq!(s.load_record().unwrap(), second, "the highest generation");
    let order: Vec<u64> = s
        .journals()
        .unwrap()
        .into_iter()
        .map(|(_, j)| match j.committed {
            Some(Sealed::Valid(c)) => c.generation,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(order, [1, 2], "oldest first: the newest is installed last");
    s.retire_journal("op2").unwrap();
    assert_eq!(names(&s.path().join("journal")), ["op2.commit"]);
    assert!(!s.path().join("applied.json").exists(), "nothing installed");
    assert!(
        !s.path().join("applied-spec.pb").exists(),
        "nothing installed"
    );
    // a write of the record outside an operation settles the commit first
    s.save_record(&record()).unwrap();
    assert!(names(&s.path().join("journal")).is_empty());
    assert_eq!(s.load_record().unwrap(), record());
    assert_eq!(
        std::fs::read(s.path().join("applied-spec.pb")).unwrap(),
        seal(b"spec-2")
    );
}

/// A spec with one file item, encoded.
fn spec_with(content: &str) -> (pb::NodeSpec, Vec<u8>) {
    let spec = pb::NodeSpec {
        files: vec![pb::File {
            path: "/etc/a".into(),
            content: content.as_bytes().to_vec(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let bytes = prost::Message::encode_to_vec(&spec);
    (spec, bytes)
}

/// The reading rule: the pending commit with the highest generation that verifies, else
/// the installed files. A commit that does not verify is passed over (the start
/// quarantines it); once no commit is pending the installed files are read again; the
/// check at start does not take a pending commit's record for a record without its spec.
#[test]
fn the_highest_verified_commit_is_read_before_the_installed_files() {
    let (_d, s) = open();
    let (spec_a, bytes_a) = spec_with("a");
    let (_spec_b, bytes_b) = spec_with("b");
    let (spec_c, bytes_c) = spec_with("c");
    let mut installed = record();
    installed.spec_hash = "sha256:installed".into();
    s.install_applied(&installed, &bytes_a).unwrap();
    assert_eq!(s.load_applied_spec().unwrap(), Some(spec_a));
    let mut rec_b = record();
    rec_b.spec_hash = "sha256:b".into();
    let mut rec_c = record();
    rec_c.spec_hash = "sha256:c".into();
    s.journal_commit(&wire_op("op-b"), &bytes_b, &rec_b, 3)
        .unwrap();
    s.journal_commit(&wire_op("op-c"), &bytes_c, &rec_c, 3)
        .unwrap();
    assert_eq!(s.load_record().unwrap(), rec_c);
    assert_eq!(s.load_applied_spec().unwrap(), Some(spec_c));
    // only a commit pending and no installed record: no "record without its spec"
    std::fs::remove_file(s.path().join("applied.json")).unwrap();
    let problems = s.check(&rec_c, false);
    assert!(
        !problems.iter().any(|p| p.contains("missing although")),
        "{problems:?}"
    );
    // the newest commit damaged: it may hold a newer state than the highest one that
    // verifies, so the readers that plan fail naming it; a report reads the highest one
    // that verifies and the damage as a problem
    let c = s.path().join("journal/op-c.commit");
    let mut b = std::fs::read(&c).unwrap();
    let last = b.len() - 1;
    b[last] ^= 0x80;
    std::fs::write(&c, &b).unwrap();
    for e in [
        s.load_record().unwrap_err(),
        s.load_applied_spec().unwrap_err(),
    ] {
        assert!(
            matches!(&e, StateError::DamagedCommit { path, .. } if path.ends_with("journal/op-c.commit")),
            "{e:?}"
        );
    }
    let (seen, problems) = s.load_record_reporting().unwrap();
    assert_eq!(seen, rec_b);
    assert!(
        problems.len() == 1 && problems[0].contains("op-c.commit"),
        "{problems:?}"
    );
    // a commit written over in place (same name, another content) is read again
    b[last] ^= 0x80;
    std::fs::write(&c, &b).unwrap();
    assert_eq!(s.load_record().unwrap(), rec_c);
    // no commit: the installed files (the record removed above reads as empty)
    std::fs::remove_file(&c).unwrap();
    std::fs::remove_file(s.path().join("journal/op-b.commit")).unwrap();
    assert_eq!(s.load_record().unwrap(), AppliedRecord::default());
    s.install_applied(&installed, &bytes_a).unwrap();
    assert_eq!(s.load_record().unwrap(), installed);
}

/// The reader's stamp cache: a commit read once is not read again while its stamp is
/// the same (no `read` noted in a trace), and a commit replaced under the same name
/// (another operation run with the same id) is read again.
#[test]
fn a_pending_commit_is_parsed_again_only_when_its_file_changed() {
    let (_d, s) = open();
    let (_, bytes) = spec_with("a");
    s.journal_commit(&wire_op("op1"), &bytes, &record(), 3)
        .unwrap();
    // past the racily-clean margin, so that the stamp may be kept
    std::thread::sleep(inplace_node::sysroot::trace::RACY + std::time::Duration::from_millis(20));
    assert_eq!(s.load_record().unwrap(), record());
    assert_eq!(s.commits_read.lock().unwrap().len(), 1, "kept");
    let mut other = record();
    other.spec_hash = "sha256:other".into();
    s.journal_commit(&wire_op("op1"), &bytes, &other, 3)
        .unwrap();
    assert_eq!(s.load_record().unwrap(), other);
}

/// A state directory as the previous release left it (format 2, `applied.json` and
/// `applied-spec.pb` installed from the commit without an fsync at every operation, the
/// commit pending) reads exactly as that release read it: the same record and spec;
/// nothing reported by the check; and a start's settle installs the same files.
#[test]
fn a_state_directory_of_the_previous_release_reads_as_before() {
    let (_d, s) = open();
    let (spec, bytes) = spec_with("a");
    journal_with_pre_image(&s, "op1");
    s.journal_commit(&wire_op("op1"), &bytes, &record(), 3)
        .unwrap();
    s.retire_journal("op1").unwrap();
    // what the previous release's install wrote
    let pretty = serde_json::to_vec_pretty(&record()).unwrap();
    std::fs::write(s.path().join("applied.json"), &pretty).unwrap();
    std::fs::write(s.path().join("applied-spec.pb"), seal(&bytes)).unwrap();
    assert_eq!(s.load_record().unwrap(), record());
    assert_eq!(s.load_applied_spec().unwrap(), Some(spec.clone()));
    let (r, why) = s.load_record_or_quarantine().unwrap();
    assert_eq!((r, why), (record(), None));
    assert!(
        s.check(&record(), false)
            .iter()
            .all(|p| p.contains("saved original")),
        "{:?}",
        s.check(&record(), false)
    );
    // a power cut lost the previous release's install of this commit: the record there
    // is an older one, and the commit is what is read (and what its start installed)
    let mut older = record();
    older.spec_hash = "sha256:older".into();
    std::fs::write(
        s.path().join("applied.json"),
        serde_json::to_vec_pretty(&older).unwrap(),
    )
    .unwrap();
    assert_eq!(s.load_record().unwrap(), record());
    // the install cut short (does not parse) is reported as before, and read from the
    // commit
    std::fs::write(s.path().join("applied.json"), &pretty[..pretty.len() / 2]).unwrap();
    let (r, why) = s.load_record_or_quarantine().unwrap();
    assert_eq!(r, record());
    let why = why.unwrap();
    assert!(why.message.contains("installed again from it"));
    assert_eq!(why.file, None);
    s.settle_commits().unwrap();
    assert_eq!(
        std::fs::read(s.path().join("applied.json")).unwrap(),
        pretty
    );
    assert_eq!(
        std::fs::read(s.path().join("applied-spec.pb")).unwrap(),
        seal(&bytes)
    );
    assert_eq!(s.load_applied_spec().unwrap(), Some(spec));
}

/// A flat journal of another format version (a newer agent's) does not verify: it is
/// never acted on.
#[test]
fn a_journal_of_another_version_does_not_verify() {
    let (_d, s) = open();
    let mut intent = journal_with_pre_image(&s, "op1");
    intent.version = 3;
    s.journal_intent(&intent, false).unwrap();
    let (_, j) = &s.journals().unwrap()[0];
    assert!(
        matches!(&j.intent, Sealed::Damaged(w) if w.contains("journal format 3")),
        "{:?}",
        j.intent
    );
    let head = r#"{"version":3,"generation":1,"phase":3,"record":{}}"#;
    std::fs::write(
        s.path().join("journal/op1.commit"),
        seal(format!("{head}\n").as_bytes()),
    )
    .unwrap();
    let (_, j) = &s.journals().unwrap()[0];
    assert!(
        matches!(&j.committed, Some(Sealed::Damaged(w)) if w.contains("journal format Some(3)")),
        "{:?}",
        j.committed
    );
}

/// The progress marker: the first is a new file (0600); a marker at least as long is
/// written over it in place (same inode); a shorter one replaces the file; each reads
/// back verified as itself.
#[test]
fn a_progress_marker_is_rewritten_in_place_when_it_grows() {
    use std::os::unix::fs::MetadataExt;
    let (_d, s) = open();
    std::fs::create_dir_all(s.path().join("journal")).unwrap();
    let p = s.path().join("journal/op.progress");
    let read = || s.read_progress("/journal/op.progress");
    s.journal_progress("op", "staged").unwrap();
    let first = std::fs::metadata(&p).unwrap();
    assert_eq!(first.mode() & 0o7777, 0o600);
    assert_eq!(read(), Sealed::Valid("staged".to_string()));
    s.journal_progress("op", "written").unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().ino(), first.ino());
    assert_eq!(read(), Sealed::Valid("written".to_string()));
    assert_eq!(std::fs::read(&p).unwrap(), seal(b"written"));
    s.journal_progress("op", "acted").unwrap();
    assert_eq!(read(), Sealed::Valid("acted".to_string()));
    assert_eq!(std::fs::read(&p).unwrap(), seal(b"acted"));
    // a link in its place is never written through (refused, as every state write is)
    std::fs::remove_file(&p).unwrap();
    let target = s.path().join("elsewhere");
    std::fs::write(&target, b"").unwrap();
    std::os::unix::fs::symlink(&target, &p).unwrap();
    assert!(s.journal_progress("op", "written").is_err());
    assert_eq!(std::fs::read(&target).unwrap(), b"");
}

/// An engine marker is written without an fsync; an effect's (a Kubernetes upgrade's
/// step, which the journal can not undo) durably: its content and its name, so that no
/// power cut brings back an earlier marker. Both read back as written.
#[test]
fn an_effects_marker_is_durable_the_engines_are_not() {
    let (_t, s) = open();
    std::fs::create_dir_all(s.path().join("journal")).unwrap();
    let before = inplace_node::sysroot::fsyncs_on_this_thread();
    s.journal_progress("op1", "staged").unwrap();
    s.journal_progress("op1", "written").unwrap();
    assert_eq!(inplace_node::sysroot::fsyncs_on_this_thread(), before);
    s.journal_progress_durable("op1", "kubernetes: upgraded")
        .unwrap();
    assert_eq!(
        inplace_node::sysroot::fsyncs_on_this_thread(),
        before + 2,
        "the marker's content and the journal directory"
    );
    assert_eq!(
        s.read_progress("/journal/op1.progress"),
        Sealed::Valid("kubernetes: upgraded".to_string())
    );
}

/// The kept coverage's trace of a read of the record sees every change of its source: a
/// newer commit, a settle (the commit removed, the files installed), a write of the
/// installed record with no commit pending.
#[test]
fn a_trace_of_the_record_sees_a_change_of_its_source() {
    use inplace_node::sysroot::trace;
    let (_d, s) = open();
    let (_, bytes) = spec_with("a");
    s.journal_commit(&wire_op("op1"), &bytes, &record(), 3)
        .unwrap();
    let roots = [s.sysroot()];
    let sealed = || {
        // past the racily-clean margin of the last write
        std::thread::sleep(trace::RACY + std::time::Duration::from_millis(20));
        let (r, t) = trace::record(|| s.load_record().unwrap());
        let seal = t.seal(&roots).unwrap();
        assert!(seal.holds(&roots));
        (r, seal)
    };
    let (r, seal) = sealed();
    assert_eq!(r, record());
    let mut second = record();
    second.spec_hash = "sha256:second".into();
    s.journal_commit(&wire_op("op2"), &bytes, &second, 3)
        .unwrap();
    s.retire_journal("op2").unwrap();
    assert!(!seal.holds(&roots), "a newer commit");
    let (r, seal) = sealed();
    assert_eq!(r, second);
    s.settle_commits().unwrap();
    assert!(!seal.holds(&roots), "settled");
    let (r, seal) = sealed();
    assert_eq!(r, second);
    s.save_record(&record()).unwrap();
    assert!(!seal.holds(&roots), "the installed record written");
    assert_eq!(sealed().0, record());
}
