//! The memo: the racily-clean rule, and every change a read must see.

use super::*;

fn root(limits: MemoLimits) -> (tempfile::TempDir, Sysroot) {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("etc/sysctl.d")).unwrap();
    let s = Sysroot::open(d.path()).unwrap().with_memo(limits);
    (d, s)
}

/// Keeps what was written a moment ago (no racy margin), so each test can change a file
/// and look again at once.
fn settled() -> MemoLimits {
    MemoLimits {
        racy: Duration::ZERO,
        racy_coarse: Duration::ZERO,
        ..MemoLimits::default()
    }
}

fn text(_: &str, p: Probe) -> String {
    match p {
        Probe::Present {
            content: Some(c), ..
        } => String::from_utf8(c).unwrap(),
        other => format!("{other:?}"),
    }
}

fn same(_: &str, t: Option<String>) -> Option<String> {
    t
}

/// Sets the mtime of `p` to `secs` (the ctime becomes now: it can not be set).
fn set_mtime(p: &std::path::Path, secs: i64) {
    let t = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: secs,
            tv_nsec: 0,
        },
    };
    rustix::fs::utimensat(rustix::fs::CWD, p, &t, AtFlags::empty()).unwrap();
}

fn stamp(mtime: (u64, u64), ctime: (u64, u64)) -> Stamp {
    Stamp([1, 2, 3, mtime.0, mtime.1, ctime.0, ctime.1])
}

#[test]
fn racily_clean_is_a_change_within_the_margin_before_the_read_or_after_it() {
    let read_at = Duration::new(1_000, 500_000_000);
    let two = Duration::from_secs(2);
    // settled: both times older than 2 s before the read
    assert!(!stamp((990, 0), (997, 0)).is_racy(read_at, two));
    assert!(!stamp((998, 499_999_999), (900, 0)).is_racy(read_at, two));
    // the later of mtime and ctime counts: an mtime set back does not hide a fresh ctime
    assert!(stamp((100, 0), (999, 0)).is_racy(read_at, two));
    assert!(stamp((999, 0), (100, 0)).is_racy(read_at, two));
    // exactly the margin before the read, the same instant, or after it (a clock step)
    assert!(stamp((998, 500_000_000), (0, 0)).is_racy(read_at, two));
    assert!(stamp((1_000, 500_000_000), (0, 0)).is_racy(read_at, two));
    assert!(stamp((5_000, 0), (0, 0)).is_racy(read_at, two));
    // a zero margin keeps anything changed before the read began
    assert!(!stamp((1_000, 499_999_999), (0, 0)).is_racy(read_at, Duration::ZERO));
    // before the epoch (a negative mtime) is long settled
    let before_epoch = stamp(((-5i64) as u64, 0), (10, 0));
    assert!(!before_epoch.is_racy(read_at, two));
    // whole-second times are a coarse file system's (FAT), sub-second ones a fine one's
    assert!(stamp((10, 0), (10, 0)).is_coarse());
    assert!(!stamp((10, 0), (10, 1)).is_coarse());
    assert!(!stamp((10, 7), (10, 0)).is_coarse());
}

/// The usual margins: 50 ms after the later of the two times, 2 s without sub-second
/// parts, and a time after the read is always racy.
#[test]
fn racily_clean_takes_the_margin_the_times_allow() {
    let at = |s: u64, ns: u64| Duration::new(s, ns as u32);
    let racy = super::super::trace::RACY.as_nanos() as u64;
    let t = stamp((100, 500), (100, 900));
    assert!(t.is_racily_clean(at(100, 900 + racy - 1)));
    assert!(!t.is_racily_clean(at(100, 900 + racy + 1)));
    let m = stamp((100, 900), (100, 500));
    assert!(m.is_racily_clean(at(100, 900 + racy - 1)));
    assert!(t.is_racily_clean(at(99, 0)));
    let coarse = stamp((100, 0), (100, 0));
    assert!(coarse.is_racily_clean(at(101, 900_000_000)));
    assert!(!coarse.is_racily_clean(at(102, 1)));
}

#[test]
fn a_coarse_stamp_waits_the_coarse_margin() {
    let (d, s) = root(MemoLimits {
        racy: Duration::ZERO,
        racy_coarse: Duration::from_secs(3600),
        ..MemoLimits::default()
    });
    let p = d.path().join("etc/x.conf");
    std::fs::write(&p, "a\n").unwrap();
    // a fine file system: the zero fine margin keeps it
    s.probe_memo("/etc/x.conf", 1 << 20, text).unwrap();
    assert_eq!(s.memo().counts().0, 1);
    let now = rustix::fs::Timespec {
        tv_sec: 1_000,
        tv_nsec: 0,
    };
    let k = Key::new::<String>(Via::Probe(1 << 20), "/etc/y", 0);
    let coarse = stamp((now.tv_sec as u64, 0), (now.tv_sec as u64, 0));
    s.memo.put(
        k.clone(),
        coarse,
        Arc::new(String::new()),
        1,
        Duration::from_secs(2_000),
    );
    assert!(
        s.memo.get(&k, coarse).is_none(),
        "a whole-second stamp 1000 s old is within 1 h"
    );
}

#[test]
fn a_settled_file_is_read_once_and_every_change_is_seen() {
    let (d, s) = root(settled());
    let p = d.path().join("etc/x.conf");
    std::fs::write(&p, "aaaa\n").unwrap();
    let read = || s.probe_memo("/etc/x.conf", 1 << 20, text).unwrap();
    assert_eq!(*read(), "aaaa\n");
    assert_eq!(*read(), "aaaa\n");
    let (n, bytes, hits, _) = s.memo().counts();
    assert_eq!((n, bytes, hits), (1, 5, 1));
    // rewritten in place, same size, mtime put back: the ctime changed
    let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
    let secs = mtime.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&p, "bbbb\n").unwrap();
    set_mtime(&p, secs);
    assert_eq!(*read(), "bbbb\n");
    // replaced by a rename (a new inode), same size and mtime
    let q = d.path().join("etc/.x.tmp");
    std::fs::write(&q, "cccc\n").unwrap();
    set_mtime(&q, secs);
    std::fs::rename(&q, &p).unwrap();
    assert_eq!(*read(), "cccc\n");
    // removed, then a symlink in its place: never followed, never kept
    std::fs::remove_file(&p).unwrap();
    assert_eq!(*read(), "Absent");
    std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
    assert!(read().starts_with("Present"), "{}", read());
    assert_eq!(s.memo().counts().0, 0);
}

#[test]
fn a_recent_file_is_read_every_time() {
    let (d, s) = root(MemoLimits {
        racy: Duration::from_secs(3600),
        ..MemoLimits::default()
    });
    std::fs::write(d.path().join("etc/x.conf"), "a\n").unwrap();
    for _ in 0..3 {
        assert_eq!(*s.probe_memo("/etc/x.conf", 1 << 20, text).unwrap(), "a\n");
    }
    assert_eq!(s.memo().counts(), (0, 0, 0, 3));
}

#[test]
fn a_listing_sees_a_file_added_and_a_following_read_sees_a_link_retargeted() {
    let (d, s) = root(settled());
    let dir = d.path().join("etc/sysctl.d");
    std::fs::write(dir.join("10-a.conf"), "a = 1\n").unwrap();
    let list = || s.list_dir_memo("/etc/sysctl.d", true).unwrap();
    assert_eq!(*list(), Some(vec!["10-a.conf".to_string()]));
    assert_eq!(*list(), Some(vec!["10-a.conf".to_string()]));
    std::fs::write(dir.join("20-b.conf"), "b = 1\n").unwrap();
    assert_eq!(
        *list(),
        Some(vec!["10-a.conf".to_string(), "20-b.conf".to_string()])
    );
    assert_eq!(
        *s.list_dir_memo("/etc/sysctl.d", false).unwrap(),
        Some(vec!["10-a.conf".to_string(), "20-b.conf".to_string()])
    );
    // a link inside the sysroot, retargeted to a file of the same size
    std::os::unix::fs::symlink("10-a.conf", dir.join("50-l.conf")).unwrap();
    let read = || {
        s.read_following_memo("/etc/sysctl.d/50-l.conf", same)
            .unwrap()
    };
    assert_eq!(read().as_deref(), Some("a = 1\n"));
    assert_eq!(read().as_deref(), Some("a = 1\n"));
    std::fs::remove_file(dir.join("50-l.conf")).unwrap();
    std::os::unix::fs::symlink("20-b.conf", dir.join("50-l.conf")).unwrap();
    assert_eq!(read().as_deref(), Some("b = 1\n"));
    // a link out of the sysroot resolves inside it (absent here)
    std::os::unix::fs::symlink("/../../../etc/hostname", dir.join("60-out.conf")).unwrap();
    let out = s
        .read_following_memo("/etc/sysctl.d/60-out.conf", same)
        .unwrap();
    assert_eq!(*out, None);
}

#[test]
fn the_memo_is_bounded_in_entries_and_bytes() {
    let (d, s) = root(MemoLimits {
        entries: 2,
        bytes: 10,
        entry_bytes: 6,
        racy: Duration::ZERO,
        racy_coarse: Duration::ZERO,
    });
    for (n, body) in [
        ("a", "11111\n"),
        ("b", "2222\n"),
        ("c", "333\n"),
        ("big", "1234567\n"),
    ] {
        std::fs::write(d.path().join("etc").join(n), body).unwrap();
        s.probe_memo(&format!("/etc/{n}"), 1 << 20, text).unwrap();
        let (len, bytes, _, _) = s.memo().counts();
        assert!(len <= 2 && bytes <= 10, "{n}: {len} entries, {bytes} bytes");
    }
    // the larger than entry_bytes one was never kept; the least recently used went
    let (len, bytes, _, _) = s.memo().counts();
    assert_eq!((len, bytes), (2, 9));
    let before = s.memo().counts().2;
    s.probe_memo("/etc/b", 1 << 20, text).unwrap();
    s.probe_memo("/etc/c", 1 << 20, text).unwrap();
    assert_eq!(s.memo().counts().2, before + 2);
}
