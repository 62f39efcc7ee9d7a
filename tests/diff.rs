//! The diff view (`inplacectl coverage --diff`, `apply --dry-run --diff`) on the four
//! fixture nodes, with the real daemon and the real `inplacectl`: the edit of every
//! configuration file the plan writes, a files item named by its hash unless root asks
//! for its content on the local socket, never over the remote API, and never in the logs;
//! a Kubernetes upgrade's binaries (hashes and sizes) and the files kubeadm rewrites.

mod common;

use common::k8s::{Mirror, binaries as k8s_binaries, install_standins, url_config};
use common::pki::{ca, free_port, leaf, write};
use common::{Node, err, out, snapshot};
use rcgen::SanType;

/// A secret that must appear only where root asked for it.
const SECRET: &str = "token=s3cr3t-4f9a\n";

fn spec_yaml() -> String {
    format!(
        "kubelet:\n  config:\n    serializeImagePulls: false\n\
         kernelArgs: [\"isolcpus=2-7\"]\n\
         sysctls:\n  vm.max_map_count: \"262144\"\n\
         files:\n  - path: /etc/app/token\n    mode: \"0600\"\n    content: {SECRET:?}\n"
    )
}

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", inplace_node::digest::sha256_hex(b))
}

/// The node's kernel-argument file the plan edits first, and that file's line before and
/// after `isolcpus=2-7` is appended (from the fixture files).
fn kernel_edit(fixture: &str) -> (&'static str, &'static str, &'static str) {
    match fixture {
        "ubuntu-2404-grub" => (
            "/etc/default/grub",
            "-GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt\"\n",
            "+GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt isolcpus=2-7\"\n",
        ),
        "fedora-41-bls" => (
            "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64.conf",
            "-options root=UUID=88be9724-6475-4e38-ba1d-43420e7b7574 ro rootflags=subvol=root no_timer_check console=tty1 console=ttyS0,115200n8 systemd.firstboot=off transparent_hugepage=madvise\n",
            "+options root=UUID=88be9724-6475-4e38-ba1d-43420e7b7574 ro rootflags=subvol=root no_timer_check console=tty1 console=ttyS0,115200n8 systemd.firstboot=off transparent_hugepage=madvise isolcpus=2-7\n",
        ),
        "rhel8-grubenv" => (
            "/boot/grub2/grubenv",
            "-kernelopts=root=/dev/mapper/rhel-root ro crashkernel=auto rd.lvm.lv=rhel/root rhgb quiet systemd.unified_cgroup_hierarchy=1 \n",
            "+kernelopts=root=/dev/mapper/rhel-root ro crashkernel=auto rd.lvm.lv=rhel/root rhgb quiet systemd.unified_cgroup_hierarchy=1 isolcpus=2-7 \n",
        ),
        "systemd-boot" => (
            "/etc/kernel/cmdline",
            "-root=UUID=1065c5b0-0d3d-4b2c-b710-081db0e60316 ro quiet console=tty0 console=ttyS1,115200n8 intel_iommu=on iommu=pt hugepagesz=2M hugepages=4096\n",
            "+root=UUID=1065c5b0-0d3d-4b2c-b710-081db0e60316 ro quiet console=tty0 console=ttyS1,115200n8 intel_iommu=on iommu=pt hugepagesz=2M hugepages=4096 isolcpus=2-7\n",
        ),
        other => panic!("no kernel edit for {other}"),
    }
}

/// The text of one file's diff in `inplacectl`'s table output: from its `diff <path>`
/// header to the next header.
fn section<'a>(text: &'a str, path: &str) -> &'a str {
    let head = format!("\ndiff {path} (");
    let start = text
        .find(&head)
        .unwrap_or_else(|| panic!("no diff of {path} in:\n{text}"));
    let rest = &text[start + 1..];
    // each header is preceded by a blank line
    let end = rest.find("\n\ndiff ").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

fn started(fixture: &str) -> Node {
    let mut node = Node::new(fixture);
    // the edit of the default itself (trials: tests/kernel_args_trial.rs)
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
    node.log_file = Some(node.dir.path().join("agent.log"));
    node.start();
    node
}

#[test]
fn coverage_diff_on_every_fixture_node() {
    for fixture in [
        "ubuntu-2404-grub",
        "fedora-41-bls",
        "rhel8-grubenv",
        "systemd-boot",
    ] {
        let node = started(fixture);
        let spec = node.spec("spec.yaml", &spec_yaml());
        let before = snapshot(&node.root);
        let o = node.ctl(&["coverage", "-f", &spec, "--diff"]);
        let text = out(&o);
        assert_eq!(o.status.code(), Some(0), "{fixture}: {text}{}", err(&o));

        // kubelet config: the field added, the rest kept as context
        let kubelet = section(&text, "/var/lib/kubelet/config.yaml");
        assert!(
            kubelet.starts_with(
                "diff /var/lib/kubelet/config.yaml (update; kubelet.config.serializeImagePulls)\n\
                 --- /var/lib/kubelet/config.yaml\n+++ /var/lib/kubelet/config.yaml\n@@ "
            ),
            "{fixture}: {kubelet}"
        );
        assert!(
            kubelet.contains("\n+serializeImagePulls: false\n"),
            "{fixture}: {kubelet}"
        );
        assert_eq!(kubelet.matches("\n+").count(), 2, "{fixture}: {kubelet}");
        assert_eq!(kubelet.matches("\n-").count(), 1, "{fixture}: {kubelet}");

        // kernel arguments: the file of the node's boot loader, that line only
        let (path, old, new) = kernel_edit(fixture);
        let kernel = section(&text, path);
        assert!(
            kernel.starts_with(&format!("diff {path} (update; kernelArgs[isolcpus])\n")),
            "{fixture}: {kernel}"
        );
        assert!(
            kernel.contains(&format!("\n{old}{new}")),
            "{fixture}: {kernel}"
        );
        // a grubenv block is shown as its variables, not its '#' padding
        assert!(
            !kernel.contains("\n-#") && !kernel.contains("\n+#"),
            "{kernel}"
        );

        // the sysctl drop-in, created
        let sysctl = section(&text, "/etc/sysctl.d/99-zz-inplaced.conf");
        assert!(
            sysctl.starts_with(
                "diff /etc/sysctl.d/99-zz-inplaced.conf (create; sysctls[vm.max_map_count])\n\
                 --- /dev/null\n+++ /etc/sysctl.d/99-zz-inplaced.conf\n"
            ),
            "{fixture}: {sysctl}"
        );
        assert!(sysctl.ends_with("+vm.max_map_count = 262144\n"), "{sysctl}");

        // the files item: hashes and sizes, no content
        let file = section(&text, "/etc/app/token");
        assert_eq!(
            file,
            format!(
                "diff /etc/app/token (create; files[/etc/app/token])\n  content withheld: {}\n  before: absent\n  after:  {} ({} bytes)\n",
                inplace_agent::plan::diff::WITHHELD_CONFIDENTIAL,
                sha256(SECRET.as_bytes()),
                SECRET.len()
            ),
            "{fixture}"
        );
        assert!(!text.contains("s3cr3t"), "{fixture}: {text}");
        assert!(
            !node.log().contains("s3cr3t"),
            "{fixture}: secret in the log"
        );
        assert_eq!(snapshot(&node.root), before, "{fixture}: coverage wrote");
    }
}

#[test]
fn json_carries_the_diffs_as_fields_and_only_when_asked() {
    let node = started("rhel8-grubenv");
    let spec = node.spec("spec.yaml", &spec_yaml());
    let plain = node.ctl(&["coverage", "-f", &spec, "-o", "json"]);
    let plain: serde_json::Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert!(plain.get("diffs").is_none(), "{plain}");

    let o = node.ctl(&["coverage", "-f", &spec, "--diff", "-o", "json"]);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let diffs = r["diffs"].as_array().unwrap();
    let paths: Vec<&str> = diffs.iter().map(|d| d["path"].as_str().unwrap()).collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted, "sorted by path");
    let env = diffs
        .iter()
        .find(|d| d["path"] == "/boot/grub2/grubenv")
        .unwrap();
    let block = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    assert_eq!(env["operation"], "CHANGE_OPERATION_UPDATE");
    assert_eq!(
        env["changeIds"],
        serde_json::json!(["kernelArgs[isolcpus]"])
    );
    assert_eq!(env["beforeSha256"], sha256(&block));
    assert_eq!(env["beforeSize"], "1024");
    assert_eq!(env["afterSize"], "1024");
    let (_, old, new) = kernel_edit("rhel8-grubenv");
    assert!(
        env["unified"]
            .as_str()
            .unwrap()
            .contains(&format!("{old}{new}")),
        "{env}"
    );
    let token = diffs
        .iter()
        .find(|d| d["path"] == "/etc/app/token")
        .unwrap();
    assert_eq!(token["afterSha256"], sha256(SECRET.as_bytes()));
    assert_eq!(token["afterSize"], SECRET.len().to_string());
    assert!(token.get("unified").is_none(), "{token}");
    assert_eq!(
        token["withheld"],
        inplace_agent::plan::diff::WITHHELD_CONFIDENTIAL
    );
}

#[test]
fn show_content_as_root_then_apply_and_the_log_never_has_the_secret() {
    let node = started("ubuntu-2404-grub");
    let spec = node.spec("spec.yaml", &spec_yaml());
    let o = node.ctl(&["coverage", "-f", &spec, "--diff", "--show-content"]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", err(&o));
    assert_eq!(
        section(&text, "/etc/app/token"),
        format!(
            "diff /etc/app/token (create; files[/etc/app/token])\n--- /dev/null\n+++ /etc/app/token\n@@ -0,0 +1 @@\n+{SECRET}"
        )
    );

    // --show-content needs --diff; --diff needs --dry-run
    let o = node.ctl(&["coverage", "-f", &spec, "--show-content"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    let o = node.ctl(&["apply", "-f", &spec, "--diff"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("needs --dry-run"), "{}", err(&o));
    assert_eq!(out(&node.ctl(&["history"])), "no operations\n");

    // the dry run's diff is the coverage's: same plan, same code path
    let dry = node.ctl(&[
        "apply",
        "-f",
        &spec,
        "--dry-run",
        "--diff",
        "--show-content",
    ]);
    let dry_text = out(&dry);
    assert_eq!(dry.status.code(), Some(0), "{dry_text}{}", err(&dry));
    let from = |t: &str| t[t.find("\ndiff ").unwrap()..].to_string();
    assert_eq!(from(&dry_text), from(&text));
    let dry_json = node.ctl(&["apply", "-f", &spec, "--dry-run", "--diff", "-o", "json"]);
    let op: serde_json::Value = serde_json::from_slice(&dry_json.stdout).unwrap();
    assert_eq!(op["dryRun"], true);
    let paths: Vec<&str> = op["diffs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/etc/app/token",
            "/etc/default/grub",
            "/etc/sysctl.d/99-zz-inplaced.conf",
            "/var/lib/kubelet/config.yaml"
        ],
        "{op}"
    );

    // after the apply there is nothing left to diff
    let o = node.ctl(&["apply", "-f", &spec, "--id", "op-1", "--wait"]);
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    assert_eq!(node.read("/etc/app/token"), SECRET);
    let o = node.ctl(&["coverage", "-f", &spec, "--diff", "--show-content"]);
    assert!(!out(&o).contains("\ndiff "), "{}", out(&o));
    let log = node.log();
    assert!(
        log.contains("op-1"),
        "the log is the debug log of the apply"
    );
    assert!(!log.contains("s3cr3t"), "secret in the log:\n{log}");
}

#[test]
fn show_content_is_refused_on_the_remote_api() {
    let mut node = Node::new("fedora-41-bls");
    let d = node.dir.path().to_path_buf();
    let server_ca = ca("inplaced server CA");
    let client_ca = ca("clients CA");
    let server = leaf(
        &server_ca,
        "node-1",
        vec![SanType::DnsName("localhost".try_into().unwrap())],
    );
    let admin = leaf(&client_ca, "capi-extension", vec![]);
    let addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &node.config,
        format!(
            "[api.tcp]\nlisten = \"{addr}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [[api.tcp.clients]]\nidentity = \"capi-extension\"\nmatch = \"cn\"\nrole = \"admin\"\n",
            write(&d, "server.crt", &server.0),
            write(&d, "server.key", &server.1),
            write(&d, "clients-ca.crt", &client_ca.pem),
        ),
    )
    .unwrap();
    node.log_file = Some(d.join("agent.log"));
    node.start();
    let spec = node.spec("spec.yaml", &spec_yaml());
    let (ca_pem, cert, key) = (
        write(&d, "ca.pem", &server_ca.pem),
        write(&d, "admin.crt", &admin.0),
        write(&d, "admin.key", &admin.1),
    );
    let remote = |args: &[&str]| {
        let mut all = vec![
            "--connect",
            &addr,
            "--tls-ca",
            &ca_pem,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-server-name",
            "localhost",
        ];
        all.extend_from_slice(args);
        node.ctl(&all)
    };
    for args in [
        &["coverage", "-f", &spec, "--diff", "--show-content"][..],
        &[
            "apply",
            "-f",
            &spec,
            "--dry-run",
            "--diff",
            "--show-content",
        ][..],
    ] {
        let o = remote(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", out(&o));
        assert!(
            err(&o).contains("PermissionDenied: show_content is refused on the remote API"),
            "{args:?}: {}",
            err(&o)
        );
        assert!(!out(&o).contains("s3cr3t"));
    }
    // without show_content the remote admin gets the diff, the files item by its hash
    let o = remote(&["coverage", "-f", &spec, "--diff"]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", err(&o));
    assert!(
        section(&text, "/etc/app/token").contains(&sha256(SECRET.as_bytes())),
        "{text}"
    );
    assert!(text.contains("+serializeImagePulls: false\n"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
    assert!(!node.log().contains("s3cr3t"));
}

#[test]
fn chrony_servers_diff_in_its_own_file() {
    let node = started("rhel8-grubenv");
    let spec = node.spec(
        "spec.yaml",
        "ntp:\n  servers: [ntp1.example.invalid, ntp2.example.invalid]\n",
    );
    let o = node.ctl(&["coverage", "-f", &spec, "--diff"]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", err(&o));
    let chrony = section(&text, "/etc/chrony.conf");
    assert!(
        chrony.starts_with(
            "diff /etc/chrony.conf (update; ntp)\n--- /etc/chrony.conf\n+++ /etc/chrony.conf\n"
        ),
        "{chrony}"
    );
    assert!(
        chrony.contains("\n+server ntp2.example.invalid iburst\n"),
        "{chrony}"
    );
}

/// The ubuntu fixture at Kubernetes v1.34.3 (stand-in binaries), the `url` source on
/// `mirror`, which serves v1.35.2; a control-plane node when `control_plane`.
fn k8s_node(mirror: &Mirror, control_plane: bool) -> Node {
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    std::fs::write(&node.config, url_config(mirror)).unwrap();
    if control_plane {
        let dir = node.path("/etc/kubernetes/manifests");
        std::fs::create_dir_all(&dir).unwrap();
        for c in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "etcd",
        ] {
            let image = format!("registry.k8s.io/{c}:v1.34.3");
            std::fs::write(dir.join(format!("{c}.yaml")), format!("image: {image}\n")).unwrap();
        }
    }
    node.start();
    node
}

const K8S_SPEC: &str = "kubernetes:\n  version: v1.35.2\n";

/// issue 27 §5: a Kubernetes upgrade's dry run lists each binary replaced (before from
/// the node, after from the mirror's `.sha256` and size), the copies kept for the
/// roll-back, and each file kubeadm rewrites as not known ahead; text and JSON agree.
#[test]
fn a_kubernetes_upgrade_lists_its_binaries_and_the_files_kubeadm_rewrites() {
    let mirror = Mirror::start();
    let new = mirror.release("v1.35.2");
    let old = k8s_binaries("v1.34.3");
    let node = k8s_node(&mirror, false);
    let spec = node.spec("spec.yaml", K8S_SPEC);
    let before = snapshot(&node.root);
    let o = node.ctl(&["apply", "-f", &spec, "--dry-run", "--diff"]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", err(&o));
    let base = format!(
        "https://127.0.0.1:{}/release/v1.35.2/bin/linux/amd64",
        mirror.port
    );
    for b in ["kubeadm", "kubectl", "kubelet"] {
        let got = section(&text, &format!("/usr/bin/{b}"));
        assert_eq!(
            got,
            format!(
                "diff /usr/bin/{b} (update; kubernetes.version)\n  content withheld: binary: {b} v1.35.2 from {base}/{b}, SHA-256 from {base}/{b}.sha256; the download is verified against its sigstore signature and this SHA-256 before anything is installed\n  before: {} ({} bytes)\n  after:  {} ({} bytes)\n",
                sha256(&old[b]),
                old[b].len(),
                sha256(&new[b]),
                new[b].len()
            )
        );
        let kept = format!("/var/lib/inplaced-kubernetes/previous/{b}-v1.34.3");
        assert_eq!(
            section(&text, &kept),
            format!(
                "diff {kept} (create; kubernetes.version)\n  content withheld: binary: the previous /usr/bin/{b} (v1.34.3), kept for the roll-back\n  before: absent\n  after:  {} ({} bytes)\n",
                sha256(&old[b]),
                old[b].len()
            )
        );
    }
    let config = std::fs::read(node.path("/var/lib/kubelet/config.yaml")).unwrap();
    assert_eq!(
        section(&text, "/var/lib/kubelet/config.yaml"),
        format!(
            "diff /var/lib/kubelet/config.yaml (update; kubernetes.version)\n  rewritten by kubeadm upgrade node, content not known ahead\n  before: {} ({} bytes)\n  after:  not known ahead\n",
            sha256(&config),
            config.len()
        )
    );
    let flags = std::fs::read(node.path("/var/lib/kubelet/kubeadm-flags.env")).unwrap();
    assert!(
        section(&text, "/var/lib/kubelet/kubeadm-flags.env").ends_with(&format!(
            "  before: {} ({} bytes)\n  after:  not known ahead\n",
            sha256(&flags),
            flags.len()
        )),
        "{text}"
    );
    assert!(
        !text.contains("/etc/kubernetes/manifests"),
        "a worker: {text}"
    );
    // nothing downloaded: the checksum files and a HEAD of each binary only
    let asked = mirror.requests.lock().unwrap().clone();
    assert!(
        asked
            .iter()
            .all(|r| r.starts_with("HEAD ") || r.ends_with(".sha256")),
        "{asked:?}"
    );
    assert!(asked.contains(&"GET /release/v1.35.2/bin/linux/amd64/kubelet.sha256".to_string()));
    assert!(asked.contains(&"HEAD /release/v1.35.2/bin/linux/amd64/kubelet".to_string()));
    assert_eq!(snapshot(&node.root), before, "a dry run wrote");

    // -o json: the same values as fields
    let o = node.ctl(&["apply", "-f", &spec, "--dry-run", "--diff", "-o", "json"]);
    let op: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let diffs = op["diffs"].as_array().unwrap();
    let find = |p: &str| {
        diffs
            .iter()
            .find(|d| d["path"] == p)
            .unwrap_or_else(|| panic!("{p}: {op}"))
    };
    let kubelet = find("/usr/bin/kubelet");
    assert_eq!(kubelet["operation"], "CHANGE_OPERATION_UPDATE");
    assert_eq!(
        kubelet["changeIds"],
        serde_json::json!(["kubernetes.version"])
    );
    assert_eq!(kubelet["beforeSha256"], sha256(&old["kubelet"]));
    assert_eq!(kubelet["beforeSize"], old["kubelet"].len().to_string());
    assert_eq!(kubelet["afterSha256"], sha256(&new["kubelet"]));
    assert_eq!(kubelet["afterSize"], new["kubelet"].len().to_string());
    assert!(kubelet.get("afterUnknown").is_none(), "{kubelet}");
    let cfg = find("/var/lib/kubelet/config.yaml");
    assert_eq!(cfg["afterUnknown"], true);
    assert_eq!(
        cfg["withheld"],
        "rewritten by kubeadm upgrade node, content not known ahead"
    );
    assert_eq!(cfg["beforeSha256"], sha256(&config));
    assert!(cfg.get("afterSha256").is_none(), "{cfg}");
    let paths: Vec<&str> = diffs.iter().map(|d| d["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "/usr/bin/kubeadm",
            "/usr/bin/kubectl",
            "/usr/bin/kubelet",
            "/var/lib/inplaced-kubernetes/previous/kubeadm-v1.34.3",
            "/var/lib/inplaced-kubernetes/previous/kubectl-v1.34.3",
            "/var/lib/inplaced-kubernetes/previous/kubelet-v1.34.3",
            "/var/lib/kubelet/config.yaml",
            "/var/lib/kubelet/kubeadm-flags.env",
        ]
    );
}

/// On a control-plane node the static Pod manifests are listed as kubeadm's too.
#[test]
fn a_control_plane_upgrade_lists_the_static_pod_manifests() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let node = k8s_node(&mirror, true);
    let spec = node.spec("spec.yaml", K8S_SPEC);
    let o = node.ctl(&["coverage", "-f", &spec, "--diff"]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}{}", err(&o));
    for c in [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        let path = format!("/etc/kubernetes/manifests/{c}.yaml");
        let body = format!("image: registry.k8s.io/{c}:v1.34.3\n");
        assert_eq!(
            section(&text, &path),
            format!(
                "diff {path} (update; kubernetes.version)\n  rewritten by kubeadm upgrade node, content not known ahead\n  before: {} ({} bytes)\n  after:  not known ahead\n",
                sha256(body.as_bytes()),
                body.len()
            )
        );
    }
}
