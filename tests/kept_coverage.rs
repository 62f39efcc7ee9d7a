//! Kept coverage answers (issue 28), black box: the real daemon answers the same request
//! again from what it kept while the node stays the same, and every change to something
//! the answer read, made by anyone between two calls, gives the fresh answer: a kernel
//! parameter's live value (a `/proc/sys` file), a sysctl.d file added, a kubelet config
//! rewritten in place, the GRUB defaults replaced by a rename, a managed file created by
//! someone else, the record an apply wrote, a kubelet binary replaced (its version asked
//! again). Each case compares the answer
//! with the one a daemon that keeps nothing (`INPLACED_KEEP_COVERAGE=0`) gives for the
//! same node, so "fresh" means exactly what a computation says.

mod common;

use common::k8s::{elf_standin, install_standins};
use common::kept::{age, answers, counted, settle, uncached_copy};
use common::{Node, apply, coverage};
use inplace_wire::pb;

/// A spec that reads every kind of dependency: files, kubelet config and flags,
/// sysctls (live values and sysctl.d), kernel arguments (GRUB defaults, `/proc/cmdline`).
const SPEC: &str = "files:\n  - path: /etc/kept/a.conf\n    content: \"a\\n\"\nkubelet:\n  config:\n    serializeImagePulls: false\n  flags:\n    max-pods: \"250\"\nsysctls:\n  vm.max_map_count: \"262144\"\nkernelArgs: [isolcpus=2-7]\n";

/// The same node answered by a second daemon that keeps nothing.
async fn computed(node: &Node, yaml: &str) -> pb::CoverageReport {
    let mut fresh = uncached_copy(node);
    fresh.start();
    coverage(&fresh, yaml).await
}

/// What a report says, without the fields that name the node's own run (facts).
fn said(r: &pb::CoverageReport) -> String {
    let mut r = r.clone();
    r.facts = None;
    format!("{r:?}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_between_two_calls_gives_the_computed_answer() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    settle();
    type Change = fn(&Node);
    let changes: Vec<(&str, Change)> = vec![
        ("a kernel parameter's live value", |n| {
            std::fs::write(n.path("/proc/sys/vm/max_map_count"), "262144\n").unwrap()
        }),
        ("a sysctl.d file added", |n| {
            // read after the agent's drop-in (99-zz-inplaced.conf): it overrides it at boot
            std::fs::write(
                n.path("/etc/sysctl.d/99-zzz-x.conf"),
                "vm.max_map_count = 1\n",
            )
            .unwrap()
        }),
        ("the kubelet config rewritten in place", |n| {
            let p = n.path("/var/lib/kubelet/config.yaml");
            let t = std::fs::read_to_string(&p).unwrap();
            std::fs::write(&p, format!("{t}serializeImagePulls: false\n")).unwrap();
        }),
        ("the GRUB defaults replaced by a rename", |n| {
            let p = n.path("/etc/default/grub");
            let t = std::fs::read_to_string(&p).unwrap();
            let tmp = n.path("/etc/default/.grub.new");
            std::fs::write(
                &tmp,
                t.replace(
                    "GRUB_CMDLINE_LINUX=\"",
                    "GRUB_CMDLINE_LINUX=\"isolcpus=2-7 ",
                ),
            )
            .unwrap();
            std::fs::rename(tmp, p).unwrap();
        }),
        ("the file an item writes created by someone else", |n| {
            std::fs::create_dir_all(n.path("/etc/kept")).unwrap();
            std::fs::write(n.path("/etc/kept/a.conf"), "a\n").unwrap();
        }),
    ];
    let mut last = coverage(&node, SPEC).await;
    for (what, change) in changes {
        // kept: the same answer, and the one a computation gives
        settle();
        let again = coverage(&node, SPEC).await;
        assert_eq!(said(&again), said(&last), "{what}: before the change");
        change(&node);
        let after = coverage(&node, SPEC).await;
        let fresh = computed(&node, SPEC).await;
        assert_ne!(
            said(&fresh),
            said(&last),
            "{what}: not a change the answer depends on"
        );
        assert_eq!(
            said(&after),
            said(&fresh),
            "{what}: the kept answer was given"
        );
        last = after;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_changes_the_answer_at_once() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = "sysctls:\n  vm.swappiness: \"10\"\n";
    settle();
    let before = coverage(&node, yaml).await;
    assert_eq!(before.changes.len(), 1, "{before:?}");
    assert_eq!(said(&coverage(&node, yaml).await), said(&before));
    let op = apply(&node, yaml, "swap").await;
    assert_eq!(op.phase(), pb::Phase::Succeeded, "{op:?}");
    // at once (racily clean: not kept) and later (kept): nothing left to change
    for _ in 0..2 {
        let after = coverage(&node, yaml).await;
        assert!(
            after.changes.iter().all(|c| c.before == c.after),
            "{after:?}"
        );
        assert_eq!(said(&after), said(&computed(&node, yaml).await));
        settle();
    }
}

/// A node with the metrics listener on loopback and the stand-in kubelet and kubeadm of
/// `version` (installed an hour ago), run for their `--version`.
fn counted_node(version: &str) -> (Node, String) {
    counted("ubuntu-2404-grub", |node| {
        install_standins(node, version);
        // compiled: the agent keeps a program's answer, never a script's
        for b in ["kubelet", "kubeadm"] {
            let p = node.path(&format!("/usr/bin/{b}"));
            std::fs::write(&p, elf_standin(b, version, None)).unwrap();
            age(&p);
        }
    })
}

/// The same request on an unchanged node is answered from what was kept (counted as
/// `kept`), and a Kubernetes version's `kubelet --version` is asked once, then kept with
/// the binary's stamp: a kubelet replaced by an upgrade is asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_is_kept_and_a_replaced_kubelet_asked_again() {
    let (node, addr) = counted_node("v1.34.2");
    let yaml = "kubernetes:\n  version: v1.34.3\nsysctls:\n  vm.swappiness: \"10\"\n";
    assert_eq!(answers(&addr), (0.0, 0.0));
    let first = coverage(&node, yaml).await;
    let up = common::change(&first, "kubernetes.version");
    assert_eq!(
        (up.before.as_str(), up.after.as_str()),
        ("v1.34.2", "v1.34.3")
    );
    // the first ran kubelet --version: computed, not kept; the second found the version
    // kept and is kept itself; the third is the kept answer
    let second = coverage(&node, yaml).await;
    assert_eq!(said(&second), said(&first));
    assert_eq!(answers(&addr), (0.0, 2.0));
    for k in 1..=3 {
        assert_eq!(said(&coverage(&node, yaml).await), said(&first));
        assert_eq!(answers(&addr), (f64::from(k), 2.0));
    }
    // another request is computed and kept beside the first
    let other = coverage(&node, "sysctls:\n  vm.swappiness: \"11\"\n").await;
    assert_ne!(said(&other), said(&first));
    assert_eq!(answers(&addr), (3.0, 3.0));
    // an upgraded kubelet (replaced by a rename, as a package manager does)
    let kubelet = node.path("/usr/bin/kubelet");
    let tmp = node.path("/usr/bin/.kubelet.new");
    std::fs::write(&tmp, elf_standin("kubelet", "v1.34.3", None)).unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    age(&tmp);
    std::fs::rename(&tmp, &kubelet).unwrap();
    // the node is at the target now: no upgrade to make
    let after = coverage(&node, yaml).await;
    assert!(
        after.changes.iter().all(|c| c.id != "kubernetes.version"),
        "{after:?}"
    );
    assert_eq!(answers(&addr), (3.0, 4.0));
}

/// `INPLACED_KEEP_COVERAGE=0`: every answer is computed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_kept_when_switched_off() {
    let (node, addr) = counted("ubuntu-2404-grub", |n| {
        n.env.push(("INPLACED_KEEP_COVERAGE".into(), "0".into()))
    });
    for _ in 0..3 {
        coverage(&node, SPEC).await;
        settle();
    }
    assert_eq!(answers(&addr), (0.0, 3.0));
}
