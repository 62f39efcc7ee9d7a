//! Trying to make kept coverage answers (issue 28) stale, black box: for each change to
//! something a coverage reads, made between two calls after the answer was kept, the
//! daemon's answer must be exactly the one a daemon that keeps nothing
//! (`INPLACED_KEEP_COVERAGE=0`) gives on a copy of the same root, state and config.
//! Each scenario first checks that the second call was a kept answer (the metrics
//! counter), so that "the same after the change" can fail, and that the change is one
//! the answer depends on (the fresh answer differs from the first).

mod common;

use std::os::unix::fs::{PermissionsExt, symlink};

use common::k8s::{binaries, elf_standin, install_standins};
use common::kept::{age, answers, counted, cp_a, settle, uncached_copy};
use common::{Node, spec};
use inplace_wire::pb;

/// A request's answer as text: the report without facts, or the error's code and message
/// with the daemon's own directories named alike.
type Answer = String;

async fn ask(node: &Node, req: &pb::GetCoverageRequest) -> Answer {
    let r = node.client().await.get_coverage(req.clone()).await;
    let text = match r {
        Ok(r) => {
            let mut r = r.into_inner();
            r.facts = None;
            format!("{r:?}")
        }
        Err(s) => format!("error {:?}: {}", s.code(), s.message()),
    };
    text.replace(&node.root.display().to_string(), "<root>")
        .replace(&node.state.display().to_string(), "<state>")
}

fn req(yaml: &str) -> pb::GetCoverageRequest {
    pb::GetCoverageRequest {
        desired: Some(spec(yaml)),
        ..Default::default()
    }
}

/// The answer of a daemon that keeps nothing, on a copy of `node`'s root, state and
/// config (without the metrics listener), with the same environment.
async fn fresh(node: &Node, req: &pb::GetCoverageRequest) -> Answer {
    let mut f = uncached_copy(node);
    f.start();
    ask(&f, req).await
}

/// The answer of a daemon that keeps nothing, on `node`'s own root (for a change a copy
/// does not carry: a mount, a file attribute) with a copy of its state and config.
async fn fresh_here(node: &Node, req: &pb::GetCoverageRequest) -> Answer {
    let mut f = Node::new("ubuntu-2404-grub");
    f.root = node.root.clone();
    if node.state.exists() {
        cp_a(&node.state, &f.state);
        let _ = std::fs::remove_file(f.state.join("lock"));
    }
    f.env = node.env.clone();
    f.env.push(("INPLACED_KEEP_COVERAGE".into(), "0".into()));
    f.start();
    let a = ask(&f, req).await;
    a.replace(&f.state.display().to_string(), "<state>")
}

/// Asks until an answer is kept (equal to `first`), at most 4 times: a kept answer
/// before the change, else a scenario can not fail. An answer whose computation saw a
/// file changed a moment before is not kept (the racy window), and once on CI's loaded
/// machine the second call computed; the daemon logs why an answer was not kept
/// (`counted`'s filter).
async fn ask_until_kept(
    what: &str,
    node: &Node,
    addr: &str,
    r: &pb::GetCoverageRequest,
    first: &Answer,
) {
    for attempt in 1.. {
        settle();
        let (kept, _) = answers(addr);
        assert_eq!(&ask(node, r).await, first, "{what}: before the change");
        if answers(addr).0 == kept + 1.0 {
            return;
        }
        assert!(
            attempt < 4,
            "{what}: {attempt} calls after the first were not kept answers (the scenario can not fail): {first}"
        );
    }
}

/// Asks, asks again (must be a kept answer, equal to the first), makes `change`, asks
/// once more: the answer must be the fresh one, which must differ from the first.
async fn scenario(
    what: &str,
    node: &Node,
    addr: &str,
    r: &pb::GetCoverageRequest,
    change: impl FnOnce(&Node),
) {
    scenario_on(what, node, addr, r, change, false).await;
}

/// [`scenario`], the fresh answer from a daemon on the same root when `here`.
async fn scenario_on(
    what: &str,
    node: &Node,
    addr: &str,
    r: &pb::GetCoverageRequest,
    change: impl FnOnce(&Node),
    here: bool,
) {
    let first = ask(node, r).await;
    ask_until_kept(what, node, addr, r, &first).await;
    change(node);
    let after = ask(node, r).await;
    let want = if here {
        fresh_here(node, r).await
    } else {
        fresh(node, r).await
    };
    assert_ne!(want, first, "{what}: not a change the answer depends on");
    assert_eq!(after, want, "{what}: a stale kept answer was given");
}

fn write(node: &Node, p: &str, text: &str) {
    let p = node.path(p);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn relink(node: &Node, link: &str, target: &str) {
    let l = node.path(link);
    let tmp = l.with_extension("relink-tmp");
    symlink(target, &tmp).unwrap();
    std::fs::rename(tmp, l).unwrap();
}

/// `touch -d` of a node path to an hour ago (mtime and atime put back; ctime moves).
fn touch_back(node: &Node, p: &str) {
    let st = std::process::Command::new("touch")
        .args(["-h", "-d", "1 hour ago"])
        .arg(node.path(p))
        .status()
        .unwrap();
    assert!(st.success());
}

const SYSCTL: &str = "sysctls:\n  vm.max_map_count: \"262144\"\n";

/// The sysroot's own `/` is trust-checked when a drop-in marked `keep` is read
/// (`Sysroot::read_trusted`: StrictModes from the sysroot's `/` down): a `/` made
/// writable by others after the answer was kept must refuse the drop-in, as a fresh
/// computation does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sysroot_root_made_untrusted_refuses_a_kept_drop_in() {
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        write(
            n,
            "/etc/inplaced/node.d/20-x.yaml",
            "sysctls:\n  vm.swappiness: \"5\"\n",
        );
    });
    let r = pb::GetCoverageRequest {
        desired: Some(pb::NodeSpec {
            dropins: vec![pb::DropIn {
                name: "20-x.yaml".into(),
                content: String::new(),
                keep: true,
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    // the kept drop-in rewritten: a daemon started on a copy would apply node.d at its
    // start, so the answer is checked for the new value instead
    let first = ask(&node, &r).await;
    ask_until_kept("the kept drop-in", &node, &addr, &r, &first).await;
    write(
        &node,
        "/etc/inplaced/node.d/20-x.yaml",
        "sysctls:\n  vm.swappiness: \"6\"\n",
    );
    let after = ask(&node, &r).await;
    assert!(after.contains("after: \"6\""), "{first}\n{after}");
    settle();
    scenario("node.d made writable by its group", &node, &addr, &r, |n| {
        std::fs::set_permissions(
            n.path("/etc/inplaced/node.d"),
            std::fs::Permissions::from_mode(0o775),
        )
        .unwrap();
    })
    .await;
    std::fs::set_permissions(
        node.path("/etc/inplaced/node.d"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    settle();
    let root = node.root.clone();
    scenario("/ made writable by others", &node, &addr, &r, |_| {
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    })
    .await;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A kubelet installed as a snap (`/snap/bin/kubelet -> /usr/bin/snap`, one program for
/// every snap's command): `snap refresh` retargets `/snap/kubelet/current` and changes
/// the version `kubelet --version` answers, while the file the command resolves to
/// (`snap`) stays the same. A fresh daemon asks and sees the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refreshed_snap_kubelet_is_asked_again() {
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        install_standins(n, "v1.34.2");
        for (rev, v) in [("100", "v1.34.2"), ("101", "v1.34.3")] {
            let k = n.path(&format!("/snap/kubelet/{rev}/kubelet"));
            std::fs::create_dir_all(k.parent().unwrap()).unwrap();
            std::fs::write(&k, &binaries(v)["kubelet"]).unwrap();
            std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        symlink("100", n.path("/snap/kubelet/current")).unwrap();
        let snap = n.path("/usr/bin/snap");
        std::fs::write(
            &snap,
            "#!/bin/sh\n# a multi-call program: runs the command its name says\nexec \"$INPLACED_STANDIN_ROOT/snap/$(basename \"$0\")/current/$(basename \"$0\")\" \"$@\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::remove_file(n.path("/usr/bin/kubelet")).unwrap();
        symlink("snap", n.path("/usr/bin/kubelet")).unwrap();
        for b in ["snap", "kubeadm"] {
            age(&n.path(&format!("/usr/bin/{b}")));
        }
    });
    let r = req("kubernetes:\n  version: v1.34.3\n");
    let first = ask(&node, &r).await;
    assert!(first.contains("v1.34.2"), "{first}");
    settle();
    assert_eq!(ask(&node, &r).await, first);
    settle();
    assert_eq!(ask(&node, &r).await, first);
    relink(&node, "/snap/kubelet/current", "101");
    let after = ask(&node, &r).await;
    let want = fresh(&node, &r).await;
    assert_ne!(want, first, "not a change the answer depends on");
    assert_eq!(after, want, "the version before the refresh was given");
    let _ = addr;
    // a status poll sees the version the node runs
    let st = common::status(&node).await;
    assert_eq!(st.kubernetes_version, "v1.34.3");
}

/// Compiled stand-in kubelets of `versions` at `/opt/k/<version>/kubelet`, and a compiled
/// kubeadm of the first at `/usr/bin/kubeadm` (a script's answer is never kept).
fn kubelets(n: &Node, versions: &[&str]) {
    let kubeadm = n.path("/usr/bin/kubeadm");
    std::fs::write(&kubeadm, elf_standin("kubeadm", versions[0], None)).unwrap();
    for v in versions {
        let k = n.path(&format!("/opt/k/{v}/kubelet"));
        std::fs::create_dir_all(k.parent().unwrap()).unwrap();
        std::fs::write(&k, elf_standin("kubelet", v, None)).unwrap();
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o755)).unwrap();
        age(&k);
    }
}

/// `kubelet -> /etc/alternatives/kubelet -> /opt/k/<version>/kubelet` (relative links,
/// so that the host runs the same file): kept, and asked again once the alternative is
/// switched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alternatives_kubelet_is_kept_and_asked_again_when_switched() {
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        install_standins(n, "v1.34.2");
        kubelets(n, &["v1.34.2", "v1.34.3"]);
        std::fs::create_dir_all(n.path("/etc/alternatives")).unwrap();
        symlink(
            "../../opt/k/v1.34.2/kubelet",
            n.path("/etc/alternatives/kubelet"),
        )
        .unwrap();
        std::fs::remove_file(n.path("/usr/bin/kubelet")).unwrap();
        symlink("../../etc/alternatives/kubelet", n.path("/usr/bin/kubelet")).unwrap();
        age(&n.path("/usr/bin/kubeadm"));
    });
    let r = req("kubernetes:\n  version: v1.34.3\n");
    // the first asks kubelet --version (not kept)
    ask(&node, &r).await;
    settle();
    scenario("the alternative switched", &node, &addr, &r, |n| {
        relink(
            n,
            "/etc/alternatives/kubelet",
            "../../opt/k/v1.34.3/kubelet",
        );
    })
    .await;
}

/// A kubelet that is a wrapper script (`exec /opt/k/current/kubelet "$@"`, as some
/// distributions install it): switching `current` changes what `kubelet --version`
/// answers while the script, the only file whose stamp the version is kept with, stays
/// the same. A script's answer is never kept: the wrapper is asked every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_wrapper_script_is_asked_again() {
    let (node, _addr) = counted("ubuntu-2404-grub", |n| {
        install_standins(n, "v1.34.2");
        kubelets(n, &["v1.34.2", "v1.34.3"]);
        symlink("v1.34.2", n.path("/opt/k/current")).unwrap();
        let k = n.path("/usr/bin/kubelet");
        std::fs::write(
            &k,
            "#!/bin/sh\nexec \"$INPLACED_STANDIN_ROOT/opt/k/current/kubelet\" \"$@\"\n",
        )
        .unwrap();
        for b in ["kubelet", "kubeadm"] {
            age(&n.path(&format!("/usr/bin/{b}")));
        }
    });
    let r = req("kubernetes:\n  version: v1.34.3\n");
    let first = ask(&node, &r).await;
    assert!(first.contains("v1.34.2"), "{first}");
    settle();
    assert_eq!(ask(&node, &r).await, first);
    relink(&node, "/opt/k/current", "v1.34.3");
    let after = ask(&node, &r).await;
    let want = fresh(&node, &r).await;
    assert_ne!(want, first, "not a change the answer depends on");
    assert_eq!(after, want, "the version before the switch was given");
}

/// sysctl.d files that are symlinks: the link retargeted, its target rewritten in place
/// (same size, mtime put back), a symlinked directory on the target's way retargeted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_d_symlinks_and_their_targets() {
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        for o in ["o1", "o2"] {
            write(n, &format!("/srv/{o}/v/a.conf"), "vm.max_map_count = 1\n");
            write(
                n,
                &format!("/srv/{o}/v/b.conf"),
                "vm.max_map_count = 262144\n",
            );
        }
        write(n, "/srv/o2/v/a.conf", "vm.max_map_count = 262144\n");
        symlink("srv/o1", n.path("/opt")).unwrap();
        symlink("/opt/v/a.conf", n.path("/etc/sysctl.d/99-zzzz-v.conf")).unwrap();
    });
    let r = req(SYSCTL);
    scenario("the link retargeted", &node, &addr, &r, |n| {
        relink(n, "/etc/sysctl.d/99-zzzz-v.conf", "/opt/v/b.conf");
    })
    .await;
    scenario(
        "the target rewritten, same size, mtime back",
        &node,
        &addr,
        &r,
        |n| {
            std::fs::write(
                n.path("/srv/o1/v/b.conf"),
                "vm.max_map_count = 2\n\n\n\n\n\n",
            )
            .unwrap();
            assert_eq!(
                std::fs::metadata(n.path("/srv/o1/v/b.conf")).unwrap().len(),
                26
            );
            touch_back(n, "/srv/o1/v/b.conf");
        },
    )
    .await;
    scenario(
        "a directory link on the target's way",
        &node,
        &addr,
        &r,
        |n| {
            relink(n, "/opt", "srv/o2");
        },
    )
    .await;
    scenario(
        "/etc/sysctl.d swapped for a link to a copy",
        &node,
        &addr,
        &r,
        |n| {
            cp_a(&n.path("/etc/sysctl.d"), &n.path("/etc/sysctl.d.real"));
            std::fs::remove_dir_all(n.path("/etc/sysctl.d")).unwrap();
            symlink("sysctl.d.real", n.path("/etc/sysctl.d")).unwrap();
        },
    )
    .await;
}

/// The kubelet's flags env, its unit's EnvironmentFile, a unit drop-in added, and the
/// kubelet config replaced by a hard link's rewrite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_inputs() {
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        std::fs::hard_link(
            n.path("/var/lib/kubelet/config.yaml"),
            n.path("/var/lib/kubelet/config.link"),
        )
        .unwrap();
    });
    let r = req(
        "kubelet:\n  config:\n    serializeImagePulls: false\n  flags:\n    max-pods: \"250\"\n",
    );
    scenario("a unit drop-in added", &node, &addr, &r, |n| {
        write(
            n,
            "/etc/systemd/system/kubelet.service.d/20-x.conf",
            "[Service]\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS --max-pods=120\n",
        );
    })
    .await;
    std::fs::remove_file(node.path("/etc/systemd/system/kubelet.service.d/20-x.conf")).unwrap();
    settle();
    scenario(
        "the EnvironmentFile's KUBELET_EXTRA_ARGS",
        &node,
        &addr,
        &r,
        |n| {
            let p = "/etc/default/kubelet";
            let t = n.read(p);
            write(n, p, &format!("{t}KUBELET_EXTRA_ARGS=--max-pods=110\n"));
        },
    )
    .await;
    scenario(
        "the flags env, same size, mtime back",
        &node,
        &addr,
        &r,
        |n| {
            let p = "/var/lib/kubelet/kubeadm-flags.env";
            let t = n.read(p);
            let t2 = t.replace("--max-pods=110", "--max-pods=250");
            assert_eq!(t2.len(), t.len());
            write(n, p, &t2);
            touch_back(n, p);
        },
    )
    .await;
    scenario(
        "the config rewritten through a hard link",
        &node,
        &addr,
        &r,
        |n| {
            let p = n.path("/var/lib/kubelet/config.link");
            let t = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, format!("{t}serializeImagePulls: false\n")).unwrap();
        },
    )
    .await;
}

/// chrony's `include /etc/chrony.d/*.conf`: a file added to the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chrony_include_glob_file_added() {
    let (node, addr) = counted("rhel8-grubenv", |n| {
        let t = n.read("/etc/chrony.conf");
        write(
            n,
            "/etc/chrony.conf",
            &format!("{t}include /etc/chrony.d/*.conf\n"),
        );
    });
    let r = req("ntp:\n  servers: [ntp1.example.invalid]\n");
    scenario("a file matching the glob", &node, &addr, &r, |n| {
        write(
            n,
            "/etc/chrony.d/x.conf",
            "server other.example.invalid iburst\n",
        );
    })
    .await;
}

/// GRUB: a grub.d fragment added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_fragment_added() {
    let (node, addr) = counted("ubuntu-2404-grub", |_| {});
    let r = req("kernelArgs: [isolcpus=2-7]\n");
    scenario("a grub.d fragment", &node, &addr, &r, |n| {
        write(
            n,
            "/etc/default/grub.d/70-x.cfg",
            "GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX isolcpus=2-7\"\n",
        );
    })
    .await;
}

/// BLS: `/etc/kernel/cmdline` and an entry's options.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bls_inputs() {
    let (node, addr) = counted("fedora-41-bls", |_| {});
    let r = req("kernelArgs: [isolcpus=2-7]\n");
    scenario("/etc/kernel/cmdline", &node, &addr, &r, |n| {
        let p = "/etc/kernel/cmdline";
        let t = n.read(p);
        write(n, p, &format!("{} isolcpus=2-7\n", t.trim_end()));
    })
    .await;
    scenario("a BLS entry's options", &node, &addr, &r, |n| {
        let dir = n.path("/boot/loader/entries");
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let t = std::fs::read_to_string(&p).unwrap();
            let t: String = t
                .lines()
                .map(|l| {
                    if l.starts_with("options") {
                        format!("{l} isolcpus=2-7\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            std::fs::write(&p, t).unwrap();
        }
    })
    .await;
}

/// A file's owner named by a user whose uid `/etc/passwd` changes (same size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwd_changes_an_owner() {
    let (node, addr) = counted("ubuntu-2404-grub", |_| {});
    let r = req(
        "files:\n- path: /etc/etcd-defrag/defrag.env\n  content: \"A=1\\n\"\n  owner: etcd:etcd\n",
    );
    scenario("etcd's uid", &node, &addr, &r, |n| {
        let t = n.read("/etc/passwd");
        let line = t.lines().find(|l| l.starts_with("etcd:")).unwrap();
        let uid: Vec<&str> = line.split(':').collect();
        let new_uid = if uid[2].ends_with('1') {
            format!("{}2", &uid[2][..uid[2].len() - 1])
        } else {
            format!("{}1", &uid[2][..uid[2].len() - 1])
        };
        let mut f = uid.clone();
        f[2] = &new_uid;
        write(n, "/etc/passwd", &t.replace(line, &f.join(":")));
        touch_back(n, "/etc/passwd");
    })
    .await;
}

/// The immutable attribute set on a file the plan writes (when the file system has
/// attributes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chattr_immutable_on_a_written_file() {
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        write(n, "/etc/kept/a.conf", "old\n");
    });
    let p = node.path("/etc/kept/a.conf");
    let ok = std::process::Command::new("chattr")
        .arg("+i")
        .arg(&p)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("no chattr here: skipped");
        return;
    }
    std::process::Command::new("chattr")
        .arg("-i")
        .arg(&p)
        .status()
        .unwrap();
    settle();
    let r = req("files:\n  - path: /etc/kept/a.conf\n    content: \"a\\n\"\n");
    scenario_on(
        "chattr +i",
        &node,
        &addr,
        &r,
        |_| {
            assert!(
                std::process::Command::new("chattr")
                    .arg("+i")
                    .arg(&p)
                    .status()
                    .unwrap()
                    .success()
            );
        },
        true,
    )
    .await;
    std::process::Command::new("chattr")
        .arg("-i")
        .arg(&p)
        .status()
        .unwrap();
}

/// Unmounts what a test mounted, whatever happens.
struct Mounted(std::path::PathBuf);
impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// A read-only bind mount of the directory a written file is in (its own inode, the
/// same stamp: only the mount flags change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_bind_mount_of_a_written_directory() {
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        write(n, "/etc/kept/a.conf", "old\n");
    });
    let dir = node.path("/etc/kept");
    let r = req("files:\n  - path: /etc/kept/a.conf\n    content: \"a\\n\"\n");
    let mut guard = None;
    scenario_on(
        "a read-only bind mount",
        &node,
        &addr,
        &r,
        |_| {
            let ok = std::process::Command::new("mount")
                .arg("--bind")
                .arg(&dir)
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "mount --bind");
            guard = Some(Mounted(dir.clone()));
            let ok = std::process::Command::new("mount")
                .args(["-o", "remount,bind,ro"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "remount ro");
        },
        true,
    )
    .await;
    // the answer that names the read-only mount is kept, and goes when it is writable again
    scenario_on(
        "remounted read-write",
        &node,
        &addr,
        &r,
        |_| {
            let ok = std::process::Command::new("mount")
                .args(["-o", "remount,bind,rw"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "remount rw");
        },
        true,
    )
    .await;
    drop(guard);
}

/// A sysctl.d file changed within a few milliseconds after a kept answer was given, and
/// again right after a computed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_right_after_a_call() {
    let (node, _addr) = counted("ubuntu-2404-grub", |n| {
        write(
            n,
            "/etc/sysctl.d/99-zzzz-v.conf",
            "vm.max_map_count = 111111\n",
        );
    });
    let r = req(SYSCTL);
    ask(&node, &r).await;
    settle();
    for i in 0..8 {
        // the same size each time: only the value differs
        let v = if i % 2 == 0 { "262144" } else { "111111" };
        ask(&node, &r).await;
        std::fs::write(
            node.path("/etc/sysctl.d/99-zzzz-v.conf"),
            format!("vm.max_map_count = {v}\n"),
        )
        .unwrap();
        let after = ask(&node, &r).await;
        let want = fresh(&node, &r).await;
        assert_eq!(after, want, "round {i}");
        if i % 3 == 0 {
            settle();
        }
    }
}

/// More specs than slots, asked in turn: every answer is right, and the counter adds
/// up to the calls made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_specs_than_slots_and_an_honest_counter() {
    let (node, addr) = counted("ubuntu-2404-grub", |_| {});
    let specs: Vec<String> = (0..6)
        .map(|i| format!("sysctls:\n  vm.swappiness: \"{}\"\n", 10 + i))
        .collect();
    let mut calls = 0.0;
    for round in 0..3 {
        for (i, y) in specs.iter().enumerate() {
            let a = ask(&node, &req(y)).await;
            calls += 1.0;
            assert!(
                a.contains(&format!("after: \"{}\"", 10 + i)),
                "{round}: {a}"
            );
        }
        settle();
    }
    let (k, c) = answers(&addr);
    assert_eq!(k + c, calls);
    // six specs in turn through four slots: each pushed out before it is asked again
    assert_eq!(k, 0.0, "kept {k}, computed {c}");
    // four in turn: all kept after the first round
    for _ in 0..3 {
        for y in &specs[..4] {
            ask(&node, &req(y)).await;
        }
        settle();
    }
    let (k2, c2) = answers(&addr);
    assert_eq!((k2 - k, c2 - c), (8.0, 4.0));
}

/// `show_content` asked by root, then the same spec without it: the second answer has
/// no content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_shown_once_is_not_kept_for_a_request_without_it() {
    let (node, _addr) = counted("ubuntu-2404-grub", |_| {});
    let y = "files:\n  - path: /etc/kept/secret.conf\n    content: \"hunter2-secret\\n\"\n";
    let mut with = req(y);
    with.diff = Some(pb::DiffOptions { show_content: true });
    let mut without = req(y);
    without.diff = Some(pb::DiffOptions {
        show_content: false,
    });
    for _ in 0..3 {
        let a = ask(&node, &with).await;
        assert!(a.contains("hunter2-secret"), "{a}");
        let b = ask(&node, &without).await;
        assert!(!b.contains("hunter2-secret"), "{b}");
        let c = ask(&node, &req(y)).await;
        assert!(!c.contains("hunter2-secret"), "{c}");
        settle();
    }
}

/// Coverage asked over and over while applies run: once they are done, the answer is
/// the fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coverage_during_applies() {
    let (node, _addr) = counted("ubuntu-2404-grub", |_| {});
    let target = "sysctls:\n  vm.swappiness: \"10\"\nfiles:\n  - path: /etc/kept/a.conf\n    content: \"a\\n\"\n";
    let r = req(target);
    ask(&node, &r).await;
    settle();
    for (i, y) in [
        target,
        "sysctls:\n  vm.swappiness: \"11\"\nfiles:\n  - path: /etc/kept/a.conf\n    content: \"b\\n\"\n",
        target,
    ]
    .iter()
    .enumerate()
    {
        let node_ref = &node;
        let asking = async {
            for _ in 0..30 {
                ask(node_ref, &r).await;
            }
        };
        let id = format!("op{i}");
        let (op, ()) = tokio::join!(common::apply(&node, y, &id), asking);
        assert_eq!(op.phase(), pb::Phase::Succeeded, "{op:?}");
        let after = ask(&node, &r).await;
        assert_eq!(after, fresh(&node, &r).await, "after apply {i}");
        settle();
        let later = ask(&node, &r).await;
        assert_eq!(later, after, "after apply {i}, later");
    }
}

/// A spec just over 1 MiB encoded is computed each time, and right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_over_a_mebibyte_is_computed_and_right() {
    let (node, addr) = counted("ubuntu-2404-grub", |_| {});
    let big = "x".repeat((1 << 20) + 10);
    let y = format!("files:\n  - path: /etc/kept/big.conf\n    content: \"{big}\"\n");
    let r = req(&y);
    let first = ask(&node, &r).await;
    settle();
    let (k, _) = answers(&addr);
    assert_eq!(ask(&node, &r).await, first);
    assert_eq!(answers(&addr).0, k, "a spec over 1 MiB was kept");
    write(&node, "/etc/kept/big.conf", &big);
    let after = ask(&node, &r).await;
    assert_ne!(after, first);
    assert_eq!(after, fresh(&node, &r).await);
}

/// The file system a written file is on fills up (through a file in a directory the
/// coverage does not read): only the free-space look can see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_system_of_a_written_file_fills_up() {
    let mut guard = None;
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        let dir = n.path("/etc/kept");
        std::fs::create_dir_all(&dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount tmpfs");
        guard = Some(Mounted(dir.clone()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/junk"), "").unwrap();
    });
    let content = "y".repeat(64 << 10);
    let r = req(&format!(
        "files:\n  - path: /etc/kept/a.conf\n    content: \"{content}\"\n"
    ));
    scenario_on(
        "the file system filled",
        &node,
        &addr,
        &r,
        |n| {
            // fill it, leaving less than the new content needs
            let junk = n.path("/etc/kept/sub/junk");
            let mut f = std::fs::OpenOptions::new().append(true).open(junk).unwrap();
            let chunk = vec![b'j'; 4096];
            while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
        },
        true,
    )
    .await;
    drop(guard);
}
