//! Tests of the sysroot: paths, symlinks, writes and probes under churn.

use super::*;

fn tmp() -> (tempfile::TempDir, Sysroot) {
    let d = tempfile::tempdir().unwrap();
    let s = Sysroot::open(d.path()).unwrap();
    (d, s)
}

#[test]
fn rejects_unnormalized_paths() {
    for p in [
        "etc/x",
        "/etc//x",
        "/etc/./x",
        "/etc/../x",
        "/etc/x/",
        "/e\0",
    ] {
        assert!(components(p).is_err(), "{p}");
    }
    assert_eq!(components("/etc/x").unwrap(), vec!["etc", "x"]);
}

#[test]
fn write_exact_mode_and_missing_parents() {
    let (d, s) = tmp();
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let created = s.write_atomic("/a/b/c", b"x", 0o1777, uid, gid).unwrap();
    assert_eq!(created, vec!["/a".to_string(), "/a/b".to_string()]);
    let e = s.stat("/a/b/c").unwrap().unwrap();
    assert_eq!(e.mode, 0o1777);
    assert_eq!(s.stat("/a/b").unwrap().unwrap().mode, 0o755);
    assert_eq!(std::fs::read(d.path().join("a/b/c")).unwrap(), b"x");
}

#[test]
fn refuses_symlinked_parent_and_file_parent() {
    let (d, s) = tmp();
    std::fs::create_dir(d.path().join("real")).unwrap();
    std::os::unix::fs::symlink("real", d.path().join("link")).unwrap();
    std::fs::write(d.path().join("file"), b"").unwrap();
    assert!(matches!(
        s.write_atomic("/link/x", b"x", 0o644, 0, 0),
        Err(SysrootError::Symlink { .. })
    ));
    assert!(matches!(
        s.parents("/file/x").unwrap(),
        Parents::Conflict(SysrootConflict {
            kind: Kind::File,
            ..
        })
    ));
    assert!(matches!(
        s.parents("/link/x").unwrap(),
        Parents::Conflict(SysrootConflict {
            kind: Kind::Symlink,
            ..
        })
    ));
    assert!(!d.path().join("real/x").exists());
}

#[test]
fn follows_relative_symlink_for_facts_only() {
    let (d, s) = tmp();
    std::fs::create_dir_all(d.path().join("usr/lib")).unwrap();
    std::fs::create_dir_all(d.path().join("etc")).unwrap();
    std::fs::write(d.path().join("usr/lib/os-release"), "ID=x\n").unwrap();
    std::os::unix::fs::symlink("../usr/lib/os-release", d.path().join("etc/os-release")).unwrap();
    assert!(s.read("/etc/os-release").is_err());
    assert_eq!(
        s.read_string_following("/etc/os-release").unwrap().unwrap(),
        "ID=x\n"
    );
}

/// A file unlinked, or replaced by a rename, while it is being probed is absent or the
/// new file, never an error, and the metadata is that of the content read (issue 16
/// §4: `open: No such file or directory` between the stat and the open).
#[test]
fn probe_sees_a_file_that_comes_and_goes_as_absent_or_whole() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (d, s) = tmp();
    std::fs::create_dir_all(d.path().join("etc/x")).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let churn = {
        let (dir, stop) = (d.path().join("etc/x"), stop.clone());
        std::thread::spawn(move || {
            let (f, tmp) = (dir.join("f.conf"), dir.join(".f.tmp"));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                std::fs::write(
                    &tmp,
                    format!("{n:0>width$}\n", width = (n % 7 + 1) as usize),
                )
                .unwrap();
                std::fs::rename(&tmp, &f).unwrap();
                if n.is_multiple_of(2) {
                    std::fs::remove_file(&f).unwrap();
                }
                n += 1;
            }
        })
    };
    // The probes run until both outcomes were seen at least once and 20 000 probes
    // were made: a fixed count raced the churn thread's start on a loaded machine (CI
    // saw 50 000 probes before the first write landed). The deadline only bounds a
    // machine that never schedules the writer; the assertion below then fails.
    let (mut absent, mut present, mut probes) = (0, 0, 0u64);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while (probes < 20_000 || absent == 0 || present == 0) && std::time::Instant::now() < deadline {
        probes += 1;
        match s.probe("/etc/x/f.conf", 1 << 20) {
            Ok(Probe::Absent) => absent += 1,
            Ok(Probe::Present {
                entry,
                content: Some(c),
            }) => {
                assert_eq!(entry.len, c.len() as u64, "metadata of another file");
                present += 1;
            }
            other => panic!("probe during churn: {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    assert!(
        absent > 0 && present > 0,
        "{absent} absent, {present} present"
    );
}

#[test]
fn probe_tells_absent_parent_conflicts_and_unread_content() {
    let (d, s) = tmp();
    std::fs::create_dir_all(d.path().join("etc/dir")).unwrap();
    std::fs::write(d.path().join("etc/file"), b"12345").unwrap();
    assert!(matches!(s.probe("/etc/none/x", 10).unwrap(), Probe::Absent));
    assert!(matches!(s.probe("/etc/none", 10).unwrap(), Probe::Absent));
    match s.probe("/etc/file/x", 10).unwrap() {
        Probe::ParentConflict(c) => assert_eq!(c.path, "/etc/file"),
        other => panic!("{other:?}"),
    }
    match s.probe("/etc/file", 10).unwrap() {
        Probe::Present { entry, content } => {
            assert_eq!(entry.len, 5);
            assert_eq!(content.as_deref(), Some(&b"12345"[..]));
        }
        other => panic!("{other:?}"),
    }
    // larger than the limit, or not a file: metadata only
    assert!(matches!(
        s.probe("/etc/file", 4).unwrap(),
        Probe::Present { content: None, .. }
    ));
    assert!(matches!(
        s.probe("/etc/dir", 10).unwrap(),
        Probe::Present { content: None, .. }
    ));
    assert!(s.probe("etc/file", 10).is_err());
}

/// Every answer of the sysroot is the same through `openat2` and through the
/// per-component walk: symlinked parents (relative, absolute, pointing out of the
/// sysroot), a file where a directory is needed, missing parents, a final symlink; and the
/// following readers resolve links inside the sysroot, never on the host.
#[test]
fn openat2_and_the_walk_answer_alike() {
    use std::os::unix::fs::symlink;
    let (d, s) = tmp();
    let r = d.path();
    std::fs::create_dir_all(r.join("usr/lib/sysctl.d")).unwrap();
    std::fs::create_dir_all(r.join("etc/kubernetes")).unwrap();
    std::fs::write(r.join("usr/lib/sysctl.d/10-a.conf"), "a = 1\n").unwrap();
    std::fs::write(r.join("etc/kubernetes/kubelet.conf"), "x").unwrap();
    std::fs::write(r.join("etc/file"), "f").unwrap();
    symlink("usr/lib", r.join("lib")).unwrap();
    symlink("/usr/lib", r.join("abs")).unwrap();
    symlink("../../../../../..", r.join("etc/up")).unwrap();
    symlink("/etc/file", r.join("etc/link")).unwrap();
    let paths = [
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/none",
        "/etc/none/x",
        "/etc/file/x",
        "/etc/link",
        "/lib/sysctl.d/10-a.conf",
        "/abs/sysctl.d/10-a.conf",
        "/etc/up/etc/file",
        "/etc/up/x",
        "/lib/sysctl.d",
        "/usr/lib/sysctl.d",
    ];
    let answers = |s: &Sysroot| -> Vec<String> {
        let mut out = Vec::new();
        for p in paths {
            out.push(format!("{p} probe {:?}", s.probe(p, 100)));
            out.push(format!("{p} stat {:?}", s.stat(p)));
            out.push(format!("{p} read {:?}", s.read(p)));
            out.push(format!("{p} list {:?}", s.list_dir(p)));
            out.push(format!("{p} parents {:?}", s.parents(p)));
            out.push(format!("{p} following {:?}", s.read_string_following(p)));
            out.push(format!("{p} list following {:?}", s.list_dir_following(p)));
        }
        out
    };
    let fast = answers(&s);
    beneath::set_available(false);
    let walk = answers(&s);
    beneath::set_available(true);
    assert_eq!(fast, walk);
    // the values themselves: links followed inside the sysroot only
    assert_eq!(
        s.read_string_following("/abs/sysctl.d/10-a.conf").unwrap(),
        Some("a = 1\n".into())
    );
    assert_eq!(
        s.read_string_following("/etc/up/etc/file").unwrap(),
        Some("f".into())
    );
    assert_eq!(
        s.list_dir_following("/lib/sysctl.d").unwrap(),
        Some(vec!["10-a.conf".to_string()])
    );
    assert!(matches!(
        s.stat("/lib/sysctl.d"),
        Err(SysrootError::Symlink { .. })
    ));
    assert!(matches!(
        s.write_atomic("/abs/x", b"x", 0o644, 0, 0),
        Err(SysrootError::Symlink { .. })
    ));
    assert!(!r.join("usr/lib/x").exists());
}

/// The listing with stamps names what `list_dir` names, each with what `stamp` says of
/// it (a symlink's own stamp, not followed); an absent directory is None, and a file
/// rewritten in place has a new stamp.
#[test]
fn a_listing_with_stamps_matches_list_dir_and_stamp() {
    let (d, s) = tmp();
    let (uid, gid) = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    assert_eq!(s.list_dir_stamped("/ops").unwrap(), None);
    s.write_atomic("/ops/a.json", b"a", 0o600, uid, gid)
        .unwrap();
    s.write_atomic("/ops/b.json", b"bb", 0o600, uid, gid)
        .unwrap();
    std::os::unix::fs::symlink("/nowhere", d.path().join("ops/c")).unwrap();
    let listed = s.list_dir_stamped("/ops").unwrap().unwrap();
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, s.list_dir("/ops").unwrap().unwrap());
    for (n, stamp) in &listed {
        assert_eq!(*stamp, s.stamp(&format!("/ops/{n}")).unwrap(), "{n}");
        assert!(stamp.is_some(), "{n}");
    }
    let before = listed[0].1;
    std::fs::write(d.path().join("ops/a.json"), b"longer").unwrap();
    let after = s.list_dir_stamped("/ops").unwrap().unwrap();
    assert_ne!(after[0].1, before);
    assert_eq!(after[0].1, s.stamp("/ops/a.json").unwrap());
}

/// A listing reads the directory from an open of its own: the root listed again and
/// again (through the walk, which opened it by `dup` of the sysroot's fd, whose offset a
/// listing would move) gives every name each time, as a directory below it does.
#[test]
fn every_listing_reads_the_whole_directory() {
    let (d, s) = tmp();
    for n in ["a", "b", "c"] {
        std::fs::create_dir(d.path().join(n)).unwrap();
        std::fs::write(d.path().join("a").join(n), n).unwrap();
    }
    let names = |v: Vec<(String, Option<Stamp>)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    for _ in 0..3 {
        assert_eq!(s.list_dir("/").unwrap().unwrap(), ["a", "b", "c"]);
        assert_eq!(
            names(s.list_dir_stamped("/").unwrap().unwrap()),
            ["a", "b", "c"]
        );
        assert_eq!(s.list_dir("/a").unwrap().unwrap(), ["a", "b", "c"]);
        let stamped = s.list_dir_stamped("/a").unwrap().unwrap();
        assert!(stamped.iter().all(|(_, st)| st.is_some()), "{stamped:?}");
        assert_eq!(names(stamped), ["a", "b", "c"]);
        assert_eq!(s.list_dir_following("/").unwrap().unwrap(), ["a", "b", "c"]);
    }
    // the memo's listing, after a change of the directory
    std::fs::create_dir(d.path().join("e")).unwrap();
    assert_eq!(
        *s.list_dir_memo("/", false).unwrap(),
        Some(vec!["a".into(), "b".into(), "c".into(), "e".into()])
    );
    assert_eq!(s.list_dir("/").unwrap().unwrap(), ["a", "b", "c", "e"]);
}
