//! A sealed trace holds exactly while what its reads depend on stays the same.

use std::path::Path;
use std::time::Duration;

use super::super::Sysroot;
use super::{poison, record};

/// A node with a few files, old enough (past [`super::RACY`]) to be sealed.
fn node() -> (tempfile::TempDir, Sysroot) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    for (f, c) in [
        ("etc/kubernetes/kubelet.conf", "a: 1\n"),
        ("etc/sysctl.d/10-a.conf", "vm.x = 1\n"),
        ("usr/lib/sysctl.d/20-b.conf", "vm.y = 2\n"),
        ("proc/cmdline", "root=/dev/sda1 quiet\n"),
    ] {
        std::fs::create_dir_all(p.join(f).parent().unwrap()).unwrap();
        std::fs::write(p.join(f), c).unwrap();
    }
    std::os::unix::fs::symlink(
        "/usr/lib/sysctl.d/20-b.conf",
        p.join("etc/sysctl.d/20-b.conf"),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(80));
    let root = Sysroot::open(p).unwrap();
    (d, root)
}

/// The reads coverage makes, of every kind a trace notes.
fn reads(root: &Sysroot) -> String {
    let mut out = String::new();
    out += &format!(
        "{:?}",
        root.read_string("/etc/kubernetes/kubelet.conf").unwrap()
    );
    out += &format!(
        "{:?}",
        root.probe("/etc/kubernetes/absent.conf", 1 << 16).unwrap()
    );
    out += &format!("{:?}", root.list_dir("/etc/sysctl.d").unwrap());
    out += &format!(
        "{:?}",
        root.read_string_following("/etc/sysctl.d/20-b.conf")
            .unwrap()
    );
    out += &format!("{:?}", root.read_string("/proc/cmdline").unwrap());
    out += &format!("{:?}", root.stat("/proc/cmdline").unwrap());
    out
}

fn sealed(root: &Sysroot) -> super::Seal {
    let (_, trace) = record(|| reads(root));
    assert!(!trace.is_empty());
    trace.seal(&[root]).unwrap()
}

#[test]
fn an_unchanged_node_holds() {
    let (_d, root) = node();
    let seal = sealed(&root);
    assert!(seal.holds(&[&root]));
    assert!(seal.holds(&[&root]), "looking does not change what is seen");
    assert!(seal.looks() >= 8, "{} looks", seal.looks());
}

/// Each change a read depends on breaks the seal (one fresh node and seal per change).
#[test]
fn every_change_a_read_depends_on_breaks_the_seal() {
    type Change = fn(&Path);
    let changes: Vec<(&str, Change)> = vec![
        ("same-size rewrite of a read file", |p| {
            std::fs::write(p.join("etc/kubernetes/kubelet.conf"), "a: 2\n").unwrap()
        }),
        ("chmod of a read file", |p| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                p.join("etc/kubernetes/kubelet.conf"),
                std::fs::Permissions::from_mode(0o600),
            )
            .unwrap()
        }),
        ("a file that was absent appears", |p| {
            std::fs::write(p.join("etc/kubernetes/absent.conf"), "x").unwrap()
        }),
        (
            "a directory that was absent appears with the file below it",
            |p| {
                std::fs::create_dir_all(p.join("etc/nothere/deeper")).unwrap();
                std::fs::write(p.join("etc/nothere/deeper/x.conf"), "x").unwrap()
            },
        ),
        ("a file on the way replaced by a directory", |p| {
            let k = p.join("etc/kubernetes/kubelet.conf");
            std::fs::remove_file(&k).unwrap();
            std::fs::create_dir(&k).unwrap();
            std::fs::write(k.join("x"), "x").unwrap()
        }),
        ("an entry added to a listed directory", |p| {
            std::fs::write(p.join("etc/sysctl.d/30-c.conf"), "vm.z = 3\n").unwrap()
        }),
        ("a followed link's target rewritten", |p| {
            std::fs::write(p.join("usr/lib/sysctl.d/20-b.conf"), "vm.y = 3\n").unwrap()
        }),
        ("a followed link pointed elsewhere (same content)", |p| {
            std::fs::write(p.join("usr/lib/sysctl.d/21-b.conf"), "vm.y = 2\n").unwrap();
            let l = p.join("etc/sysctl.d/20-b.conf");
            std::fs::remove_file(&l).unwrap();
            std::os::unix::fs::symlink("/usr/lib/sysctl.d/21-b.conf", &l).unwrap();
        }),
        ("a parent directory replaced by a symlink to a copy", |p| {
            let k = p.join("etc/kubernetes");
            std::fs::rename(&k, p.join("etc/k8s")).unwrap();
            std::os::unix::fs::symlink("k8s", &k).unwrap();
        }),
        ("a kernel interface's content", |p| {
            std::fs::write(p.join("proc/cmdline"), "root=/dev/sda1 quiet splash\n").unwrap()
        }),
        ("a read file hard-linked elsewhere (its link count)", |p| {
            std::fs::hard_link(p.join("etc/kubernetes/kubelet.conf"), p.join("etc/kc")).unwrap()
        }),
    ];
    for (what, change) in changes {
        let (d, root) = node();
        let seal = sealed(&root);
        assert!(seal.holds(&[&root]), "{what}: before");
        change(d.path());
        assert!(!seal.holds(&[&root]), "{what}: the seal still holds");
    }
}

#[test]
fn a_change_outside_the_reads_keeps_the_seal() {
    let (d, root) = node();
    let seal = sealed(&root);
    std::fs::create_dir_all(d.path().join("var/lib/other")).unwrap();
    std::fs::write(d.path().join("var/lib/other/x"), "y").unwrap();
    std::fs::write(d.path().join("usr/lib/sysctl.d/99-not-listed.conf"), "y").unwrap();
    assert!(seal.holds(&[&root]));
}

#[test]
fn a_file_changed_a_moment_ago_is_not_sealed() {
    let (d, root) = node();
    std::fs::write(d.path().join("etc/kubernetes/kubelet.conf"), "a: 3\n").unwrap();
    let (_, trace) = record(|| reads(&root));
    let why = trace.seal(&[&root]).unwrap_err();
    assert_eq!(why, "/etc/kubernetes/kubelet.conf changed a moment ago");
}

#[test]
fn a_file_changed_during_the_computation_is_not_sealed() {
    let (d, root) = node();
    let (_, trace) = record(|| {
        let out = reads(&root);
        std::fs::write(d.path().join("etc/kubernetes/kubelet.conf"), "a: 9\n").unwrap();
        out
    });
    assert_eq!(
        trace.seal(&[&root]).unwrap_err(),
        "/etc/kubernetes/kubelet.conf changed a moment ago"
    );
}

#[test]
fn a_poisoned_trace_is_not_sealed_and_a_nested_one_poisons_the_outer() {
    let (_d, root) = node();
    let ((_, inner), outer) = record(|| {
        reads(&root);
        record(|| poison("ran kubelet --version"))
    });
    assert_eq!(inner.poisoned(), Some("ran kubelet --version"));
    assert_eq!(outer.seal(&[&root]).unwrap_err(), "ran kubelet --version");
}

#[test]
fn a_read_of_a_sysroot_not_given_is_not_sealed() {
    let (_d, root) = node();
    let (_d2, other) = node();
    let (_, trace) = record(|| {
        reads(&root);
        other.read("/etc/kubernetes/kubelet.conf").unwrap()
    });
    assert!(trace.seal(&[&root]).is_err());
}

#[test]
fn no_trace_runs_outside_record() {
    let (_d, root) = node();
    reads(&root);
    assert!(!super::active());
    let (_, t) = record(|| ());
    assert!(t.is_empty());
    assert!(!super::active());
}

/// The trust checks read the sysroot's own `/` (its owner and mode): a `/` made writable
/// by others breaks the seal; an entry added to `/` (its times) does not.
#[test]
fn the_roots_mode_is_looked_at_and_not_its_times() {
    use std::os::unix::fs::PermissionsExt;
    let (d, root) = node();
    let seal = sealed(&root);
    std::fs::create_dir(d.path().join("srv")).unwrap();
    assert!(seal.holds(&[&root]));
    let mode = |m: u32| std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(m));
    let was = std::fs::metadata(d.path()).unwrap().permissions().mode();
    mode(0o777).unwrap();
    assert!(!seal.holds(&[&root]));
    mode(was).unwrap();
    assert!(seal.holds(&[&root]));
}

/// What other looks decide is not looked at: below an absent directory, and a followed
/// path with no symlink on its way (one look each per kept call).
#[test]
fn looks_decided_by_others_are_left_out() {
    let (_d, root) = node();
    let seal = |f: &dyn Fn()| record(f).1.seal(&[&root]).unwrap().looks();
    // `/` and `/nothere`: nothing below it
    assert_eq!(
        seal(&|| drop(root.probe("/nothere/a/b/c", 1024).unwrap())),
        2
    );
    // `/`, `/etc`, `/etc/kubernetes`, the file: no followed look of its own
    let plain = seal(&|| drop(root.read_string_following("/etc/kubernetes/kubelet.conf")));
    assert_eq!(plain, 4);
    // a link at the end: the followed look is kept
    let linked = seal(&|| drop(root.read_string_following("/etc/sysctl.d/20-b.conf")));
    assert_eq!(linked, 5);
}

/// A listing of the sysroot's own directory depends on its entries as any other
/// listing does: an entry removed or added breaks the seal (the state directory's
/// quarantined records are listed so, and a kept coverage answer outlived their removal).
#[test]
fn a_listing_of_the_root_breaks_when_an_entry_comes_or_goes() {
    let (d, root) = node();
    std::fs::write(d.path().join("marker"), "").unwrap();
    std::thread::sleep(Duration::from_millis(80));
    let seal_of = |root: &Sysroot| {
        let (names, trace) = record(|| root.list_dir("/").unwrap().unwrap());
        assert!(names.contains(&"marker".to_string()), "{names:?}");
        trace.seal(&[root]).unwrap()
    };
    let seal = seal_of(&root);
    assert!(seal.holds(&[&root]));
    std::fs::remove_file(d.path().join("marker")).unwrap();
    assert!(!seal.holds(&[&root]), "an entry removed");
    std::fs::write(d.path().join("marker"), "").unwrap();
    std::thread::sleep(Duration::from_millis(80));
    let seal = seal_of(&root);
    std::fs::write(d.path().join("another"), "").unwrap();
    assert!(!seal.holds(&[&root]), "an entry added");
    // a change inside a directory of the root is not a change of the root's entries
    std::thread::sleep(Duration::from_millis(80));
    let seal = seal_of(&root);
    std::fs::write(d.path().join("etc/new.conf"), "").unwrap();
    assert!(seal.holds(&[&root]));
}
