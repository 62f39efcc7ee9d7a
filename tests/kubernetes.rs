//! The `kubernetes` section end to end: the real daemon on a copy of the ubuntu fixture,
//! with stand-in kubeadm/kubelet/kubectl executables installed in the sysroot (no real
//! ones can be fetched here) and the `url` source served by a loopback HTTPS server in the
//! upstream release layout with real SHA-256 files and sigstore-style signatures by a
//! test Fulcio (tests/kubernetes_fetch.rs tests the signatures themselves).

mod common;

use common::k8s::{Mirror, binaries, install_standins, url_config};
use common::*;
use inplace_wire::pb;
use inplace_wire::pb::{DisruptionLevel, Phase};
use sha2::Digest;
use std::os::unix::fs::PermissionsExt;

/// The ubuntu fixture at `version` (stand-ins in /usr/bin), the daemon running the
/// stand-ins, `[kubernetes]` from `config`.
fn node_at(version: &str, config: &str) -> Node {
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, version);
    std::fs::write(&node.config, config).unwrap();
    node.start();
    node
}

const TO_135: &str = "kubernetes:\n  version: v1.35.2\n";

fn level(c: &pb::Change) -> DisruptionLevel {
    DisruptionLevel::try_from(c.disruption.as_ref().unwrap().level).unwrap()
}

#[tokio::test]
async fn minor_upgrade_over_url_installs_verified_binaries_in_the_guides_order() {
    let mirror = Mirror::start();
    let new = mirror.release("v1.35.2");
    let old = binaries("v1.34.3");
    let node = node_at("v1.34.3", &url_config(&mirror));
    let config_before = node.read("/var/lib/kubelet/config.yaml");

    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(c.covered, "{c:?}");
    assert_eq!(
        (c.before.as_str(), c.after.as_str()),
        ("v1.34.3", "v1.35.2")
    );
    assert_eq!(level(c), DisruptionLevel::Drain);
    assert_eq!(
        c.disruption.as_ref().unwrap().units,
        vec!["kubelet.service"]
    );
    assert!(c.reason.contains("kubeadm upgrade node"), "{}", c.reason);
    assert!(
        c.reason.contains(
            "each verified against a sigstore signature by krel-staging@k8s-releng-prod.iam.gserviceaccount.com (OIDC issuer https://accounts.google.com"
        ) && c.reason.contains("no transparency-log check"),
        "{}",
        c.reason
    );
    // coverage asked only for the checksum, signature and certificate files, with HEAD
    let asked = mirror.requests.lock().unwrap().clone();
    let mut want = Vec::new();
    for b in ["kubeadm", "kubelet", "kubectl"] {
        for ext in ["sha256", "sig", "cert"] {
            want.push(format!("HEAD /release/v1.35.2/bin/linux/amd64/{b}.{ext}"));
        }
    }
    assert_eq!(asked, want);

    let op = apply(&node, TO_135, "k8s-1").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    for (name, bytes) in &new {
        let sha = hex::encode(sha2::Sha256::digest(bytes));
        let said = format!(
            "verified {name} v1.35.2 (SHA-256 {sha}, {} bytes): each verified against a sigstore signature by",
            bytes.len()
        );
        assert!(
            op.actions.iter().any(|a| a.starts_with(&said)),
            "{said} in {:?}",
            op.actions
        );
        let p = node.path(&format!("/usr/bin/{name}"));
        assert_eq!(&std::fs::read(&p).unwrap(), bytes, "{name}");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
            0o755
        );
        let saved = node.path(&format!(
            "/var/lib/inplaced-kubernetes/previous/{name}-v1.34.3"
        ));
        assert_eq!(&std::fs::read(saved).unwrap(), &old[name], "{name} saved");
    }
    assert_eq!(
        node.read("/var/lib/kubelet/config.yaml"),
        format!("{config_before}# kubelet-config of v1.35.2\n")
    );
    // the recorded order: kubeadm install → kubeadm upgrade node → kubelet install →
    // both report the target → daemon-reload → kubelet restart
    let steps: Vec<&str> = op
        .actions
        .iter()
        .map(String::as_str)
        .filter(|a| {
            a.starts_with("installed")
                || a.starts_with("ran")
                || *a == "daemon-reload"
                || a.starts_with("restarted")
        })
        .collect();
    assert_eq!(
        steps,
        vec![
            "installed /usr/bin/kubeadm v1.35.2 (0755 0:0)",
            "ran /usr/bin/kubeadm upgrade node",
            "installed /usr/bin/kubelet v1.35.2 (0755 0:0)",
            "installed /usr/bin/kubectl v1.35.2 (0755 0:0)",
            "installed kubelet, kubectl report v1.35.2",
            "daemon-reload",
            "restarted kubelet.service",
        ]
    );
    assert_eq!(
        node.actions(),
        vec![
            "run /usr/bin/kubeadm upgrade node",
            "daemon-reload",
            "restart kubelet.service"
        ]
    );
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
    // nothing left to do
    let again = coverage(&node, TO_135).await;
    assert!(again.changes.is_empty(), "{:?}", again.changes);
}

#[tokio::test]
async fn a_bad_checksum_refuses_before_anything_changes() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    mirror.files.lock().unwrap().insert(
        "/release/v1.35.2/bin/linux/amd64/kubelet.sha256".into(),
        format!("{}\n", "0".repeat(64)).into_bytes(),
    );
    let node = node_at("v1.34.3", &url_config(&mirror));
    let before = snapshot(&node.root);
    let op = apply(&node, TO_135, "k8s-bad").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(op.message.contains("SHA-256 is"), "{}", op.message);
    assert!(op.message.contains(&"0".repeat(64)), "{}", op.message);
    assert!(op.message.contains("nothing was changed"), "{}", op.message);
    assert_eq!(snapshot(&node.root), before);
    assert!(node.actions().is_empty(), "{:?}", node.actions());
}

#[tokio::test]
async fn a_failing_kubeadm_upgrade_node_rolls_back_binaries_and_config() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let node = node_at("v1.34.3", &url_config(&mirror));
    std::fs::create_dir_all(node.path("/etc/standin")).unwrap();
    std::fs::write(node.path("/etc/standin/kubeadm-upgrade-fails"), "").unwrap();
    let before = snapshot(&node.root);
    let op = apply(&node, TO_135, "k8s-fail").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    assert!(
        op.message.contains("kubeadm upgrade node failed"),
        "{}",
        op.message
    );
    assert!(
        op.message
            .contains("unable to fetch the kubelet-config ConfigMap"),
        "{}",
        op.message
    );
    // the old binaries and the kubelet config are back, the saved copies removed again
    assert_eq!(snapshot(&node.root), before);
    assert_eq!(
        node.actions(),
        vec![
            "run /usr/bin/kubeadm upgrade node",
            "restart kubelet.service"
        ]
    );
    assert_eq!(status(&node).await.kubernetes_version, "v1.34.3");
}

#[tokio::test]
async fn coverage_tells_the_truth() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    mirror.release("v1.34.5");
    let node = node_at("v1.34.3", &url_config(&mirror));

    let skip = coverage(&node, "kubernetes: {version: v1.36.0}\n").await;
    let c = change(&skip, "kubernetes.version");
    assert!(!c.covered);
    assert!(c.reason.contains("skips 1 minor version"), "{}", c.reason);
    assert!(c.reason.contains("version skew policy"), "{}", c.reason);

    let down = coverage(&node, "kubernetes: {version: 1.33.9}\n").await;
    let c = change(&down, "kubernetes.version");
    assert!(!c.covered && c.reason.contains("downgrade"), "{}", c.reason);

    let unserved = coverage(&node, "kubernetes: {version: v1.35.0}\n").await;
    let c = change(&unserved, "kubernetes.version");
    assert!(!c.covered);
    assert!(
        c.reason.contains("checksum file of kubeadm v1.35.0"),
        "{}",
        c.reason
    );
    assert!(c.reason.contains("404"), "{}", c.reason);

    // a patch upgrade of a worker: a kubelet restart
    let patch = coverage(&node, "kubernetes: {version: v1.34.5}\n").await;
    let c = change(&patch, "kubernetes.version");
    assert!(c.covered, "{}", c.reason);
    assert_eq!(level(c), DisruptionLevel::Restart);

    let same = coverage(&node, "kubernetes: {version: v1.34.3}\n").await;
    assert!(same.changes.is_empty(), "{:?}", same.changes);
}

#[tokio::test]
async fn no_source_or_no_kubeadm_is_not_covered() {
    let node = node_at("v1.34.3", "");
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(!c.covered);
    assert!(
        c.reason.contains("no source for the Kubernetes binaries"),
        "{}",
        c.reason
    );

    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let mut node = node_at("v1.34.3", &url_config(&mirror));
    node.stop();
    std::fs::remove_file(node.path("/var/lib/kubelet/kubeadm-flags.env")).unwrap();
    node.start();
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(!c.covered);
    assert!(
        c.reason
            .contains("not set up by kubeadm (/var/lib/kubelet/kubeadm-flags.env missing)"),
        "{}",
        c.reason
    );
}

#[tokio::test]
async fn a_disruption_rule_on_the_kubelet_binary_wins() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let config = format!(
        "{}\n[[disruption]]\npath = \"/usr/bin/kubelet\"\naction = \"restart\"\nunits = [\"kubelet.service\"]\n",
        url_config(&mirror)
    );
    let node = node_at("v1.34.3", &config);
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(c.covered, "{}", c.reason);
    assert_eq!(level(c), DisruptionLevel::Restart);
    assert!(c.reason.contains("disruption rule"), "{}", c.reason);
}

fn manifest(component: &str, version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {component}\n  namespace: kube-system\nspec:\n  containers:\n  - command:\n    - {component}\n    image: registry.k8s.io/{component}:{version}\n    name: {component}\n"
    )
}

#[tokio::test]
async fn a_control_plane_node_drains_and_its_manifests_are_verified() {
    let mirror = Mirror::start();
    mirror.release("v1.34.5");
    let mut node = node_at("v1.34.3", &url_config(&mirror));
    node.stop();
    let dir = node.path("/etc/kubernetes/manifests");
    std::fs::create_dir_all(&dir).unwrap();
    for c in inplace_agent::kubernetes::CONTROL_PLANE_COMPONENTS {
        std::fs::write(dir.join(format!("{c}.yaml")), manifest(c, "v1.34.3")).unwrap();
    }
    std::fs::write(dir.join("etcd.yaml"), manifest("etcd", "3.6.4-0")).unwrap();
    node.start();
    // even a patch upgrade drains a control-plane node
    let r = coverage(&node, "kubernetes: {version: v1.34.5}\n").await;
    let c = change(&r, "kubernetes.version");
    assert!(c.covered, "{}", c.reason);
    assert_eq!(level(c), DisruptionLevel::Drain);
    assert!(c.reason.contains("control-plane node"), "{}", c.reason);
    let op = apply(&node, "kubernetes: {version: v1.34.5}\n", "cp-1").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(
        node.read("/etc/kubernetes/manifests/kube-apiserver.yaml"),
        manifest("kube-apiserver", "v1.34.5")
    );
    assert!(
        op.actions
            .contains(&"static Pod manifests name v1.34.5".to_string()),
        "{:?}",
        op.actions
    );
}

#[tokio::test]
async fn the_version_step_runs_first_and_other_sections_apply_to_the_upgraded_node() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let node = node_at("v1.34.3", &url_config(&mirror));
    let spec = "kubernetes: {version: v1.35.2}\nsysctls: {vm.swappiness: \"10\"}\n";
    let op = apply(&node, spec, "k8s-and-sysctl").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    let pos = |prefix: &str| {
        op.actions
            .iter()
            .position(|a| a.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {:?}", op.actions))
    };
    assert!(pos("restarted kubelet.service") < pos("set sysctl vm.swappiness (live)"));
    assert_eq!(node.read("/proc/sys/vm/swappiness"), "10\n");
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
}

/// Stand-in apt-mark and apt-get: holds in /etc/standin/holds, packages from
/// /var/cache/standin/<name>-<version>.
const APT_MARK: &str = r#"#!/bin/sh
H="$INPLACED_STANDIN_ROOT/etc/standin/holds"
cmd="$1"; shift
case "$cmd" in
showhold) cat "$H" ;;
hold) for p; do echo "$p" >> "$H"; done ;;
unhold) for p; do grep -vx "$p" "$H" > "$H.new"; mv "$H.new" "$H"; done ;;
*) exit 2 ;;
esac
"#;
const APT_GET: &str = r#"#!/bin/sh
R="$INPLACED_STANDIN_ROOT"
[ "$1" = install ] || exit 2
for a; do
  case "$a" in
  -*|Dpkg::*) ;;
  *=*) p=${a%%=*}; v=${a#*=}; v=${v%%-*}
       cp "$R/var/cache/standin/$p-$v" "$R/usr/bin/$p" || { echo "E: Version '$v' for '$p' was not found" >&2; exit 100; } ;;
  esac
done
"#;

/// The ubuntu fixture at v1.34.3 with the apt source: stand-in apt-get and apt-mark,
/// packages of v1.34.3 and v1.35.2 in the stand-in pool, all three held.
fn apt_node() -> Node {
    let mut node = Node::new("ubuntu-2404-grub");
    let install = |rel: &str, bytes: &[u8]| {
        let p = node.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    for (name, bytes) in binaries("v1.34.3") {
        install(&format!("/usr/bin/{name}"), &bytes);
        install(&format!("/var/cache/standin/{name}-1.34.3"), &bytes);
    }
    for (name, bytes) in binaries("v1.35.2") {
        install(&format!("/var/cache/standin/{name}-1.35.2"), &bytes);
    }
    install("/usr/bin/apt-mark", APT_MARK.as_bytes());
    install("/usr/bin/apt-get", APT_GET.as_bytes());
    install("/etc/standin/holds", b"kubeadm\nkubelet\nkubectl\n");
    std::fs::write(&node.config, "[kubernetes]\nsource = \"apt\"\n").unwrap();
    node.env.push((
        "INPLACED_RECORD_EXEC".into(),
        "/usr/bin/kubeadm,/usr/bin/kubelet,/usr/bin/kubectl,apt-get,apt-mark".into(),
    ));
    node
}

#[tokio::test]
async fn apt_rolls_back_to_the_previous_packages() {
    let mut node = apt_node();
    std::fs::write(node.path("/etc/standin/kubeadm-upgrade-fails"), "").unwrap();
    let config = node.read("/var/lib/kubelet/config.yaml");
    node.start();
    let op = apply(&node, TO_135, "k8s-apt-fail").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    let get = "run apt-get install -y --allow-downgrades -o Dpkg::Options::=--force-confold";
    assert_eq!(
        node.actions(),
        vec![
            "run apt-mark unhold kubeadm".to_string(),
            format!("{get} kubeadm=1.35.2-1.1"),
            "run apt-mark hold kubeadm".into(),
            "run /usr/bin/kubeadm upgrade node".into(),
            // undone in reverse: the previous package, its hold, then the kubelet
            "run apt-mark unhold kubeadm".into(),
            format!("{get} kubeadm=1.34.3-1.1"),
            "run apt-mark hold kubeadm".into(),
            "restart kubelet.service".into(),
        ]
    );
    assert_eq!(
        std::fs::read(node.path("/usr/bin/kubeadm")).unwrap(),
        binaries("v1.34.3")["kubeadm"]
    );
    assert_eq!(node.read("/var/lib/kubelet/config.yaml"), config);
}

#[tokio::test]
async fn apt_installs_pinned_packages_and_puts_the_holds_back() {
    let mut node = apt_node();
    node.start();
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(c.covered, "{}", c.reason);
    assert!(
        c.reason.contains("apt packages pinned to 1.35.2-1.1"),
        "{}",
        c.reason
    );
    let op = apply(&node, TO_135, "k8s-apt").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    let get = "run apt-get install -y --allow-downgrades -o Dpkg::Options::=--force-confold";
    assert_eq!(
        node.actions(),
        vec![
            "run apt-mark unhold kubeadm".to_string(),
            format!("{get} kubeadm=1.35.2-1.1"),
            "run apt-mark hold kubeadm".into(),
            "run /usr/bin/kubeadm upgrade node".into(),
            "run apt-mark unhold kubelet kubectl".into(),
            format!("{get} kubelet=1.35.2-1.1 kubectl=1.35.2-1.1"),
            "run apt-mark hold kubelet kubectl".into(),
            "daemon-reload".into(),
            "restart kubelet.service".into(),
        ]
    );
    let mut holds: Vec<String> = node
        .read("/etc/standin/holds")
        .lines()
        .map(String::from)
        .collect();
    holds.sort();
    assert_eq!(holds, vec!["kubeadm", "kubectl", "kubelet"]);
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
}

#[test]
fn the_version_is_validated_and_set_once() {
    use inplace_agent::sections::model::NodeSpec;
    use inplace_wire::yaml;
    let s = NodeSpec::from_pb(&yaml::parse("kubernetes: {version: 1.35.2}\n").unwrap()).unwrap();
    assert_eq!(s.kubernetes.unwrap().version.to_string(), "v1.35.2");
    let e = NodeSpec::from_pb(&yaml::parse("kubernetes: {version: v1.35}\n").unwrap()).unwrap_err();
    assert_eq!(e.field, "kubernetes.version");
    assert!(e.message.contains("vMAJOR.MINOR.PATCH"), "{e}");
    let twice = "kubernetes: {version: v1.35.2}\ndropins:\n- name: 10-k.yaml\n  content: \"kubernetes: {version: v1.35.2}\"\n";
    let e = NodeSpec::from_pb(&yaml::parse(twice).unwrap()).unwrap_err();
    assert_eq!(e.field, "dropins[10-k.yaml].kubernetes.version");
    assert!(e.message.contains("set it once"), "{e}");
    // the hash of a spec without the section is what it was
    let plain =
        NodeSpec::from_pb(&yaml::parse("sysctls: {vm.swappiness: \"10\"}\n").unwrap()).unwrap();
    let with = NodeSpec::from_pb(
        &yaml::parse("sysctls: {vm.swappiness: \"10\"}\nkubernetes: {version: v1.35.2}\n").unwrap(),
    )
    .unwrap();
    assert_ne!(plain.hash(), with.hash());
}

/// A stand-in dnf: versionlocks in /etc/standin/locks (`name-0:version-rev.*` lines),
/// packages from /var/cache/standin/<name>-<version>.
const DNF: &str = r#"#!/bin/sh
R="$INPLACED_STANDIN_ROOT"; L="$R/etc/standin/locks"
case "$1 $2" in
"versionlock list") cat "$L" ;;
"versionlock delete") shift 2; for p; do grep -v "^$p-[0-9]" "$L" > "$L.new"; mv "$L.new" "$L"; done ;;
"versionlock add") shift 2; for p; do v=$("$R/usr/bin/$p" --version 2>/dev/null | sed 's/.* v//'); [ -n "$v" ] || v=$("$R/usr/bin/$p" version -o short | sed 's/^v//'); echo "$p-0:$v-150500.1.1.*" >> "$L"; done ;;
"install -y")
  for a; do
    case "$a" in
    -*|install) ;;
    *-[0-9]*) p=${a%-*}; v=${a##*-}; cp "$R/var/cache/standin/$p-$v" "$R/usr/bin/$p" || exit 1 ;;
    esac
  done ;;
*) exit 2 ;;
esac
"#;

#[tokio::test]
async fn dnf_installs_pinned_packages_and_puts_the_versionlocks_back() {
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    for (name, bytes) in binaries("v1.35.2") {
        let p = node.path(&format!("/var/cache/standin/{name}-1.35.2"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    }
    let dnf = node.path("/usr/bin/dnf");
    std::fs::write(&dnf, DNF).unwrap();
    std::fs::set_permissions(&dnf, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(node.path("/etc/standin")).unwrap();
    // only kubelet is locked
    std::fs::write(
        node.path("/etc/standin/locks"),
        "kubelet-0:1.34.3-150500.1.1.*\n",
    )
    .unwrap();
    std::fs::write(&node.config, "[kubernetes]\nsource = \"dnf\"\n").unwrap();
    node.env = vec![(
        "INPLACED_RECORD_EXEC".into(),
        "/usr/bin/kubeadm,/usr/bin/kubelet,/usr/bin/kubectl,dnf".into(),
    )];
    node.start();
    let op = apply(&node, TO_135, "k8s-dnf").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    let install = "run dnf install -y --disableexcludes=kubernetes";
    assert_eq!(
        node.actions(),
        vec![
            format!("{install} kubeadm-1.35.2"),
            "run /usr/bin/kubeadm upgrade node".into(),
            "run dnf versionlock delete kubelet".into(),
            format!("{install} kubelet-1.35.2 kubectl-1.35.2"),
            "run dnf versionlock add kubelet".into(),
            "daemon-reload".into(),
            "restart kubelet.service".into(),
        ]
    );
    assert_eq!(
        node.read("/etc/standin/locks"),
        "kubelet-0:1.35.2-150500.1.1.*\n"
    );
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
}

/// `status` asks `kubelet --version` once per binary, not per call (a status poll started
/// a process each time), and asks again when the binary is replaced, rewritten in place,
/// or a symlink on the way to it is retargeted.
#[tokio::test]
async fn status_asks_the_kubelet_version_once_per_binary() {
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    let log = node.path("/var/tmp/kubelet-asked");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    // compiled: the agent keeps a program's answer, never a script's
    let counting = |version: &str| common::k8s::elf_standin("kubelet", version, Some(&log));
    let bin = node.path("/usr/bin/kubelet");
    // written as an installer does, and dated a minute back: a binary modified in the
    // last seconds is asked every time (its stamp could miss a rewrite in the same tick)
    let write = |p: &std::path::Path, text: Vec<u8>| {
        std::fs::write(p, text).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let a_minute_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        let f = std::fs::File::options().write(true).open(p).unwrap();
        f.set_modified(a_minute_ago).unwrap();
    };
    write(&bin, counting("v1.34.3"));
    node.start();
    let asked = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    for _ in 0..5 {
        assert_eq!(status(&node).await.kubernetes_version, "v1.34.3");
    }
    assert_eq!(asked(), 1, "asked once for five status calls");
    // replaced by a rename, as an upgrade installs it
    let tmp = node.path("/usr/bin/.kubelet.new");
    write(&tmp, counting("v1.35.2"));
    std::fs::rename(&tmp, &bin).unwrap();
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
    assert_eq!(asked(), 2);
    // rewritten in place, same size
    write(&bin, counting("v1.35.3"));
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.3");
    assert_eq!(asked(), 3);
    // a symlink retargeted to another binary (as update-alternatives does)
    let (a, b) = (
        node.path("/usr/bin/kubelet-a"),
        node.path("/usr/bin/kubelet-b"),
    );
    write(&a, counting("v1.34.3"));
    write(&b, counting("v1.35.2"));
    std::fs::remove_file(&bin).unwrap();
    std::os::unix::fs::symlink("kubelet-a", &bin).unwrap();
    assert_eq!(status(&node).await.kubernetes_version, "v1.34.3");
    std::fs::remove_file(&bin).unwrap();
    std::os::unix::fs::symlink("kubelet-b", &bin).unwrap();
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
    assert_eq!(asked(), 5);
    // the link stays, the file it names is rewritten
    write(&b, counting("v1.35.4"));
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.4");
    assert_eq!(asked(), 6);
}

/// A kubelet reached through a directory symlink, the usual "current" layout
/// (`/usr/bin/kubelet -> ../../opt/kube/current/kubelet`, `/opt/kube/current -> v1.35.2`):
/// the node runs it fine and `kubelet --version` answers, but the new per-binary cache
/// stamps every link on the way with no-follow opens of the parents, fails at the
/// `current` directory link and reports no version at all (before the cache it was
/// asked and shown). An empty version makes the extension leave the Machine's version out
/// of what it applies and never see a version upgrade done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_version_through_a_directory_symlink_is_reported() {
    use std::os::unix::fs::PermissionsExt;
    let mut node = Node::new("ubuntu-2404-grub");
    common::k8s::install_standins(&mut node, "v1.34.3");
    let dir = node.path("/opt/kube/v1.35.2");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("kubelet");
    std::fs::write(
        &bin,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Kubernetes v1.35.2'; else exit 2; fi\n",
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("v1.35.2", node.path("/opt/kube/current")).unwrap();
    std::fs::remove_file(node.path("/usr/bin/kubelet")).unwrap();
    std::os::unix::fs::symlink(
        "../../opt/kube/current/kubelet",
        node.path("/usr/bin/kubelet"),
    )
    .unwrap();
    let out = std::process::Command::new(node.path("/usr/bin/kubelet"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Kubernetes v1.35.2\n");
    node.start();
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
}
