//! Faithful edits and exact reverts for the YAML, sysctl drop-in and chrony.conf editors, through the real
//! daemon on fixture copies (the shell-style and boot-loader formats are in
//! `faithful_edits.rs`; the property tests of these three are next to their editors): each
//! edited format keeps the bytes the change does not touch, writes the changed value in the
//! style of its line or neighbours, and a drop from the spec gives back the original bytes.

mod common;

use common::*;
use inplace_wire::pb::Phase;

/// A KubeletConfiguration with a byte-order mark, CRLF line ends, comments and a flow
/// mapping: the new gate goes into the flow mapping, a changed string keeps its quotes,
/// and dropping both gives back the file byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_config_with_bom_crlf_and_flow_map_round_trips() {
    let mut node = Node::new("ubuntu-2404-grub");
    let path = "/var/lib/kubelet/config.yaml";
    let base = node.read(path).replace(
        "clusterDomain: cluster.local\n",
        "clusterDomain: 'cluster.local' # the DNS domain\n",
    );
    let original = format!(
        "\u{FEFF}# kubeadm wrote this\n{base}featureGates: {{KubeletTracing: false}}  # gates\n"
    )
    .replace('\n', "\r\n");
    std::fs::write(node.path(path), &original).unwrap();
    node.start();
    let yaml = "kubelet:\n  config:\n    clusterDomain: example.internal\n    featureGates:\n      NewGate: true\n";
    let op = apply(&node, yaml, "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let want = original
        .replace(
            "clusterDomain: 'cluster.local' #",
            "clusterDomain: 'example.internal' #",
        )
        .replace(
            "{KubeletTracing: false}  # gates",
            "{KubeletTracing: false, NewGate: true}  # gates",
        );
    assert_ne!(want, original);
    assert_eq!(node.read(path), want);
    let op = apply(&node, "{}", "two").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read(path), original);
}

/// An existing agent drop-in with an admin's comment and a `key=value` line: a new key
/// follows that style and the line ending, the rest stays, and dropping the key gives
/// back the file instead of deleting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_drop_in_is_edited_in_place_and_restored() {
    let mut node = Node::new("fedora-41-bls");
    let path = "/etc/sysctl.d/99-zz-inplaced.conf";
    let original = "; kept by the admin\r\n-vm.swappiness=10\r\n";
    std::fs::write(node.path(path), original).unwrap();
    std::fs::create_dir_all(node.path("/proc/sys/vm")).unwrap();
    std::fs::write(node.path("/proc/sys/vm/max_map_count"), "65530\n").unwrap();
    std::fs::write(node.path("/proc/sys/vm/swappiness"), "10\n").unwrap();
    node.start();
    let op = apply(&node, "sysctls:\n  vm.max_map_count: \"262144\"\n", "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(
        node.read(path),
        "; kept by the admin\r\n-vm.swappiness=10\r\nvm.max_map_count=262144\r\n"
    );
    assert_eq!(node.read("/proc/sys/vm/max_map_count"), "262144\n");
    let op = apply(&node, "{}", "two").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read(path), original);
    assert_eq!(node.read("/proc/sys/vm/max_map_count"), "65530\n");
}

/// A key the admin had already written in the agent's drop-in (in the slashed form, with
/// `-` and spacing of its own): the spec changes its value in place, and dropping the key
/// gives the line its old value back instead of removing it, live value included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_drop_in_key_the_admin_wrote_gets_its_line_back() {
    let mut node = Node::new("fedora-41-bls");
    let path = "/etc/sysctl.d/99-zz-inplaced.conf";
    let original = "# admin\n-vm/swappiness =  10 \nvm.overcommit_memory=1";
    std::fs::write(node.path(path), original).unwrap();
    std::fs::create_dir_all(node.path("/proc/sys/vm")).unwrap();
    std::fs::write(node.path("/proc/sys/vm/swappiness"), "10\n").unwrap();
    node.start();
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"1\"\n", "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(
        node.read(path),
        "# admin\n-vm/swappiness =  1 \nvm.overcommit_memory=1"
    );
    assert_eq!(node.read("/proc/sys/vm/swappiness"), "1\n");
    // a second apply of a new value keeps the first prior, not the agent's own value
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"5\"\n", "two").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let op = apply(&node, "{}", "three").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read(path), original);
    assert_eq!(node.read("/proc/sys/vm/swappiness"), "10\n");
}

/// chrony.conf with CRLF ends, a `pool` line and `include`/`confdir` lines: the sources
/// are replaced at the first one's place with CRLF lines, a server already named keeps
/// its options, every other line stays, and the drop restores the original bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chrony_conf_crlf_keeps_lines_and_restores() {
    let mut node = Node::new("rhel8-grubenv");
    let path = "/etc/chrony.conf";
    let original = node
        .read(path)
        .replace(
            "server ntp1.example.invalid iburst\n",
            "server ntp1.example.invalid iburst prefer maxpoll 6\nPool 2.rhel.pool.ntp.org iburst\ninclude /etc/chrony.d/*.conf\nconfdir /etc/chrony.d\n",
        )
        .replace('\n', "\r\n");
    std::fs::write(node.path(path), &original).unwrap();
    node.start();
    let yaml = "ntp:\n  servers: [ntp2.example.invalid, ntp1.example.invalid]\n";
    let op = apply(&node, yaml, "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let want = original.replace(
        "server ntp1.example.invalid iburst prefer maxpoll 6\r\nPool 2.rhel.pool.ntp.org iburst\r\n",
        "server ntp2.example.invalid iburst\r\nserver ntp1.example.invalid iburst prefer maxpoll 6\r\n",
    );
    assert_ne!(want, original);
    assert_eq!(node.read(path), want);
    let op = apply(&node, "{}", "two").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read(path), original);
}
