//! Every place a managed kubelet setting can come from is read, black box: a real
//! `inplaced` on the ubuntu fixture whose kubelet has a `--config-dir` (set through
//! `KUBELET_EXTRA_ARGS`). A KubeletConfiguration field that one of its `*.conf` drop-ins
//! sets is not covered, naming the drop-in that wins (the last in name order, per
//! upstream "Kubelet configuration directory merging"); a field no drop-in sets is. A
//! systemd unit drop-in (`kubelet.service.d/*.conf`) whose effective `ExecStart=` sets a
//! flag literally after `$KUBELET_KUBEADM_ARGS`, or does not pass it, makes the managed
//! flag (and a config field the flag overrides) not covered, naming the drop-in.

mod common;
use common::*;

const DIR: &str = "/etc/kubernetes/kubelet.conf.d";

fn with_config_dir(node: &Node) {
    std::fs::write(
        node.path("/etc/default/kubelet"),
        format!("KUBELET_EXTRA_ARGS=--config-dir={DIR}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(node.path(DIR)).unwrap();
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    for (name, body) in [
        ("10-base.conf", "imageGCHighThresholdPercent: 80\n"),
        (
            "20-site.conf",
            "imageGCHighThresholdPercent: 90\nevictionHard:\n  memory.available: 100Mi\n",
        ),
        // not a drop-in: only `*.conf` files are merged
        ("30-off.conf.disabled", "clusterDomain: other.local\n"),
    ] {
        std::fs::write(node.path(&format!("{DIR}/{name}")), format!("{head}{body}")).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_a_config_dir_drop_in_sets_is_not_covered_naming_it() {
    let mut node = Node::new("ubuntu-2404-grub");
    with_config_dir(&node);
    node.start();
    let yaml = "kubelet:\n  config:\n    imageGCHighThresholdPercent: 85\n    evictionHard:\n      memory.available: 200Mi\n    clusterDomain: edge.local\n";
    let r = coverage(&node, yaml).await;
    let gc = change(&r, "kubelet.config.imageGCHighThresholdPercent");
    assert!(!gc.covered);
    assert_eq!(
        gc.reason,
        format!(
            "KubeletConfiguration drop-in {DIR}/20-site.conf (kubelet --config-dir) sets imageGCHighThresholdPercent, and the kubelet merges its drop-ins over /var/lib/kubelet/config.yaml (a later drop-in wins): the value stays {DIR}/20-site.conf's; change it there"
        )
    );
    let ev = change(&r, "kubelet.config.evictionHard[\"memory.available\"]");
    assert!(!ev.covered);
    assert!(
        ev.reason
            .starts_with(&format!("KubeletConfiguration drop-in {DIR}/20-site.conf")),
        "{}",
        ev.reason
    );
    let cd = change(&r, "kubelet.config.clusterDomain");
    assert!(cd.covered, "{}", cd.reason);
    node.stop();
}

/// Without `--config-dir` the same drop-ins are not the kubelet's: the field is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_ins_without_config_dir_do_not_count() {
    let mut node = Node::new("ubuntu-2404-grub");
    with_config_dir(&node);
    std::fs::write(node.path("/etc/default/kubelet"), "KUBELET_EXTRA_ARGS=\n").unwrap();
    node.start();
    let r = coverage(
        &node,
        "kubelet:\n  config:\n    imageGCHighThresholdPercent: 85\n",
    )
    .await;
    let gc = change(&r, "kubelet.config.imageGCHighThresholdPercent");
    assert!(gc.covered, "{}", gc.reason);
    node.stop();
}

const UNIT_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/20-local.conf";

fn with_unit_dropin(node: &Node, exec: &str) {
    with_unit_env(node, &format!("ExecStart=\nExecStart={exec}\n"));
}

/// A systemd unit drop-in whose `ExecStart=` sets kubelet flags literally after
/// `$KUBELET_KUBEADM_ARGS`: a managed flag it sets is not covered, nor a KubeletConfiguration
/// field a literal flag overrides, each naming the drop-in; another flag is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_a_unit_drop_in_sets_are_not_covered_naming_it() {
    let mut node = Node::new("ubuntu-2404-grub");
    with_unit_dropin(
        &node,
        "/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS --max-pods=300 --kube-api-qps 40",
    );
    node.start();
    let yaml = "kubelet:\n  flags:\n    max-pods: \"250\"\n    node-ip: 192.0.2.5\n  config:\n    kubeAPIQPS: 100\n";
    let r = coverage(&node, yaml).await;
    let mp = change(&r, "kubelet.flags[max-pods]");
    assert!(!mp.covered);
    assert_eq!(
        mp.reason,
        format!(
            "--max-pods=300 in the effective ExecStart of {UNIT_DROPIN} comes after $KUBELET_KUBEADM_ARGS on the kubelet command line and overrides kubeadm-flags.env; change or remove it there"
        )
    );
    let qps = change(&r, "kubelet.config.kubeAPIQPS");
    assert!(!qps.covered);
    assert_eq!(
        qps.reason,
        format!(
            "kubelet flag --kube-api-qps=40 in the effective ExecStart of {UNIT_DROPIN} overrides KubeletConfiguration field kubeAPIQPS; change it there"
        )
    );
    let ip = change(&r, "kubelet.flags[node-ip]");
    assert!(ip.covered, "{}", ip.reason);
    node.stop();
}

/// A unit drop-in whose command line does not pass `$KUBELET_KUBEADM_ARGS`: kubeadm-flags.env
/// is not read, so no flag written there is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_line_without_kubeadm_args_covers_no_flag() {
    let mut node = Node::new("ubuntu-2404-grub");
    with_unit_dropin(
        &node,
        "/usr/bin/kubelet --config=/var/lib/kubelet/config.yaml",
    );
    node.start();
    let r = coverage(&node, "kubelet:\n  flags:\n    node-ip: 192.0.2.5\n").await;
    let ip = change(&r, "kubelet.flags[node-ip]");
    assert!(!ip.covered);
    assert_eq!(
        ip.reason,
        format!(
            "the kubelet's effective ExecStart in {UNIT_DROPIN} does not pass $KUBELET_KUBEADM_ARGS, so /var/lib/kubelet/kubeadm-flags.env is not read; change the unit there"
        )
    );
    node.stop();
}

const NTP: &str = "ntp:\n  servers: [ntp1.example.invalid, ntp2.example.invalid]\n";

/// chrony's `sourcedir` and `confdir` files (chrony.conf(5)) that name servers add time
/// sources that would stay: `ntp` is not covered, naming the file; a source directory
/// with no server in it does not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chrony_source_and_conf_dirs_with_servers_are_named() {
    let mut node = Node::new("rhel8-grubenv");
    let conf = node.read("/etc/chrony.conf");
    std::fs::write(
        node.path("/etc/chrony.conf"),
        format!("{conf}sourcedir /etc/chrony/sources.d\nconfdir /etc/chrony/conf.d\n"),
    )
    .unwrap();
    for d in ["/etc/chrony/sources.d", "/etc/chrony/conf.d"] {
        std::fs::create_dir_all(node.path(d)).unwrap();
    }
    // no server: does not count
    std::fs::write(node.path("/etc/chrony/sources.d/a.sources"), "# none\n").unwrap();
    std::fs::write(
        node.path("/etc/chrony/conf.d/10-site.conf"),
        "pool site.example.invalid iburst\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, NTP).await;
    let c = change(&r, "ntp");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "/etc/chrony/conf.d/10-site.conf (chrony `confdir` in /etc/chrony.conf) adds time sources site.example.invalid: chrony uses them alongside the managed servers, so they would stay; remove them there, or manage the file under files"
    );
    node.stop();
    // without the server there, the change is covered
    std::fs::write(
        node.path("/etc/chrony/conf.d/10-site.conf"),
        "makestep 1 3\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, NTP).await;
    assert!(change(&r, "ntp").covered, "{}", change(&r, "ntp").reason);
    node.stop();
}

/// systemd-timesyncd's other files (timesyncd.conf(5)): a drop-in with servers adds them
/// (they would stay); an empty `NTP=` in a drop-in after the agent's resets the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timesyncd_drop_ins_that_set_ntp_are_named() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(node.path("/usr/lib/systemd/systemd-timesyncd"), "").unwrap();
    let dir = node.path("/usr/lib/systemd/timesyncd.conf.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("50-vendor.conf"),
        "[Time]\nNTP=vendor.example.invalid\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, NTP).await;
    let c = change(&r, "ntp");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "/usr/lib/systemd/timesyncd.conf.d/50-vendor.conf sets NTP=vendor.example.invalid: systemd-timesyncd adds the NTP= lists of its files, so these servers would stay alongside the managed ones in /etc/systemd/timesyncd.conf.d/inplaced-ntp.conf; remove them there"
    );
    node.stop();
    std::fs::write(dir.join("50-vendor.conf"), "[Time]\nNTP=\n").unwrap();
    std::fs::write(dir.join("zz-reset.conf"), "[Time]\nNTP=\n").unwrap();
    node.start();
    let r = coverage(&node, NTP).await;
    let c = change(&r, "ntp");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "/usr/lib/systemd/timesyncd.conf.d/zz-reset.conf resets NTP= after /etc/systemd/timesyncd.conf.d/inplaced-ntp.conf, so the managed servers would not be used; remove the line there"
    );
    node.stop();
    // an empty NTP= before the agent's drop-in is harmless
    std::fs::remove_file(dir.join("zz-reset.conf")).unwrap();
    node.start();
    let r = coverage(&node, NTP).await;
    assert!(change(&r, "ntp").covered, "{}", change(&r, "ntp").reason);
    node.stop();
}

/// Writes a unit drop-in `20-local.conf` with `body` under `[Service]`.
fn with_unit_env(node: &Node, body: &str) {
    let p = node.path(UNIT_DROPIN);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, format!("[Service]\n{body}")).unwrap();
}

/// `Environment=` in a unit drop-in sets `KUBELET_EXTRA_ARGS`: kubeadm's drop-in also
/// reads `/etc/default/kubelet` with `EnvironmentFile=`, whose assignment wins over any
/// `Environment=` (systemd.exec(5)), so the drop-in's flags do not count while that file
/// sets the variable; once it does not, the flag is not covered, naming the drop-in and
/// its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_line_in_a_unit_drop_in_is_resolved_as_systemd_does() {
    let mut node = Node::new("ubuntu-2404-grub");
    with_unit_env(
        &node,
        "# local override\nEnvironment=\"KUBELET_EXTRA_ARGS=--max-pods=300\" OTHER=1\n",
    );
    node.start();
    let yaml = "kubelet:\n  flags:\n    max-pods: \"250\"\n";
    let r = coverage(&node, yaml).await;
    let mp = change(&r, "kubelet.flags[max-pods]");
    assert!(mp.covered, "{}", mp.reason);
    node.stop();
    std::fs::remove_file(node.path("/etc/default/kubelet")).unwrap();
    node.start();
    let r = coverage(&node, yaml).await;
    let mp = change(&r, "kubelet.flags[max-pods]");
    assert!(!mp.covered);
    assert_eq!(
        mp.reason,
        format!(
            "--max-pods=300 in {UNIT_DROPIN} (KUBELET_EXTRA_ARGS) at line 3 comes later on the kubelet command line and overrides kubeadm-flags.env; change or remove it there"
        )
    );
    node.stop();
}

/// An `EnvironmentFile=` a unit drop-in adds is read after `/etc/default/kubelet` and
/// wins: its `KUBELET_EXTRA_ARGS` overrides a managed flag and the config field the flag
/// stands for, each naming the file and the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_file_a_unit_drop_in_adds_is_named_with_its_line() {
    let mut node = Node::new("ubuntu-2404-grub");
    let env = "/etc/kubernetes/kubelet-extra.env";
    with_unit_env(&node, &format!("EnvironmentFile=-{env}\n"));
    std::fs::create_dir_all(node.path("/etc/kubernetes")).unwrap();
    std::fs::write(
        node.path(env),
        "# site flags\nKUBELET_EXTRA_ARGS=\"--max-pods=300 --kube-api-qps=40\"\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n").await;
    let mp = change(&r, "kubelet.flags[max-pods]");
    assert!(!mp.covered);
    assert_eq!(
        mp.reason,
        format!(
            "--max-pods=300 in {env} (KUBELET_EXTRA_ARGS) at line 2 comes later on the kubelet command line and overrides kubeadm-flags.env; change or remove it there"
        )
    );
    let r = coverage(&node, "kubelet:\n  config:\n    kubeAPIQPS: 100\n").await;
    let qps = change(&r, "kubelet.config.kubeAPIQPS");
    assert!(!qps.covered);
    assert_eq!(
        qps.reason,
        format!(
            "kubelet flag --kube-api-qps=40 in {env} (KUBELET_EXTRA_ARGS) at line 2 overrides KubeletConfiguration field kubeAPIQPS; change it there"
        )
    );
    node.stop();
}

/// `KUBELET_CONFIG_ARGS` naming another file: no config field is covered (the kubelet
/// does not read the managed file); `KUBELET_KUBEADM_ARGS` from a file read after
/// kubeadm's: no flag is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_and_kubeadm_variables_set_elsewhere_are_named() {
    let mut node = Node::new("ubuntu-2404-grub");
    with_unit_env(
        &node,
        "Environment=\"KUBELET_CONFIG_ARGS=--config=/etc/kubernetes/kubelet-config.yaml\"\n",
    );
    node.start();
    let r = coverage(
        &node,
        "kubelet:\n  config:\n    clusterDomain: edge.local\n",
    )
    .await;
    let cd = change(&r, "kubelet.config.clusterDomain");
    assert!(!cd.covered);
    assert_eq!(
        cd.reason,
        format!(
            "the kubelet reads --config=/etc/kubernetes/kubelet-config.yaml (in {UNIT_DROPIN} (KUBELET_CONFIG_ARGS) at line 2), not /var/lib/kubelet/config.yaml, so an edit of /var/lib/kubelet/config.yaml would not change what it runs with; set kubelet.config_path in the agent config to /etc/kubernetes/kubelet-config.yaml, or change it there"
        )
    );
    node.stop();
    let env = "/etc/kubernetes/kubeadm-local.env";
    with_unit_env(&node, &format!("EnvironmentFile={env}\n"));
    std::fs::create_dir_all(node.path("/etc/kubernetes")).unwrap();
    std::fs::write(node.path(env), "KUBELET_KUBEADM_ARGS=\"--max-pods=90\"\n").unwrap();
    node.start();
    let r = coverage(&node, "kubelet:\n  flags:\n    node-ip: 192.0.2.5\n").await;
    let ip = change(&r, "kubelet.flags[node-ip]");
    assert!(!ip.covered);
    assert_eq!(
        ip.reason,
        format!(
            "KUBELET_KUBEADM_ARGS is set at line 1 of {env}, which wins over /var/lib/kubelet/kubeadm-flags.env (systemd: EnvironmentFile= settings override Environment=, a later file wins), so the flags written there would not reach the kubelet; remove the setting there"
        )
    );
    node.stop();
}

/// chrony's `include` takes a glob(3) pattern (any component, `[...]` classes too) and
/// `confdir` several directories: the file that adds sources is found and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chrony_include_globs_and_several_conf_dirs_are_expanded() {
    let mut node = Node::new("rhel8-grubenv");
    let conf = node.read("/etc/chrony.conf");
    std::fs::write(
        node.path("/etc/chrony.conf"),
        format!("{conf}include /etc/chrony.d/*/[0-9]*.conf\nconfdir /etc/chrony/a /etc/chrony/b\n"),
    )
    .unwrap();
    for d in ["/etc/chrony.d/site", "/etc/chrony/a", "/etc/chrony/b"] {
        std::fs::create_dir_all(node.path(d)).unwrap();
    }
    // not matched by [0-9]*: ignored
    std::fs::write(
        node.path("/etc/chrony.d/site/x-extra.conf"),
        "server skipped.example.invalid\n",
    )
    .unwrap();
    std::fs::write(
        node.path("/etc/chrony.d/site/10-site.conf"),
        "pool glob.example.invalid iburst\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, NTP).await;
    let c = change(&r, "ntp");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "/etc/chrony.d/site/10-site.conf (chrony `include` in /etc/chrony.conf) adds time sources glob.example.invalid: chrony uses them alongside the managed servers, so they would stay; remove them there, or manage the file under files"
    );
    node.stop();
    std::fs::remove_file(node.path("/etc/chrony.d/site/10-site.conf")).unwrap();
    // the same name in both directories: only the first directory's is read
    std::fs::write(node.path("/etc/chrony/a/10-x.conf"), "makestep 1 3\n").unwrap();
    std::fs::write(
        node.path("/etc/chrony/b/10-x.conf"),
        "server masked.example.invalid\n",
    )
    .unwrap();
    std::fs::write(
        node.path("/etc/chrony/b/20-y.conf"),
        "server dir-b.example.invalid\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, NTP).await;
    let c = change(&r, "ntp");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "/etc/chrony/b/20-y.conf (chrony `confdir` in /etc/chrony.conf) adds time sources dir-b.example.invalid: chrony uses them alongside the managed servers, so they would stay; remove them there, or manage the file under files"
    );
    node.stop();
}

/// Listed as staying: a managed flag dropped from the spec gets its prior value back in
/// kubeadm-flags.env, and the restore's reason names the later source that overrides it
/// and stays (the report never implies the restored value is what the kubelet runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_flag_names_the_override_that_stays() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let op = apply(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n", "set").await;
    assert_eq!(
        op.phase,
        inplace_wire::pb::Phase::Succeeded as i32,
        "{op:?}"
    );
    node.stop();
    std::fs::write(
        node.path("/etc/default/kubelet"),
        "KUBELET_EXTRA_ARGS=\"--max-pods=300\"\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, "{}\n").await;
    let mp = change(&r, "kubelet.flags[max-pods]");
    assert!(mp.covered, "{}", mp.reason);
    assert_eq!(mp.before, "250");
    assert_eq!(mp.after, "110");
    assert_eq!(
        mp.reason,
        "dropped from the spec: the prior value is restored; kubelet restart; --max-pods=300 in /etc/default/kubelet (KUBELET_EXTRA_ARGS) at line 1 comes later on the kubelet command line and stays in effect (the spec does not control it)"
    );
    node.stop();
}

/// The same for a config field dropped from the spec that a `--config-dir` drop-in sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_config_field_names_the_drop_in_that_stays() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let op = apply(
        &node,
        "kubelet:\n  config:\n    clusterDomain: edge.local\n",
        "set",
    )
    .await;
    assert_eq!(
        op.phase,
        inplace_wire::pb::Phase::Succeeded as i32,
        "{op:?}"
    );
    node.stop();
    with_config_dir(&node);
    std::fs::write(
        node.path(&format!("{DIR}/40-domain.conf")),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nclusterDomain: site.local\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, "{}\n").await;
    let cd = change(&r, "kubelet.config.clusterDomain");
    assert!(cd.covered, "{}", cd.reason);
    assert_eq!(
        cd.reason,
        format!(
            "dropped from the spec: the prior value is restored; kubelet restart; note: KubeletConfiguration drop-in {DIR}/40-domain.conf (kubelet --config-dir) sets clusterDomain, and the kubelet merges its drop-ins over /var/lib/kubelet/config.yaml (a later drop-in wins): the value stays {DIR}/40-domain.conf's; change it there"
        )
    );
    node.stop();
}

/// The kubelet merges every `*.conf` its `filepath.WalkDir` of `--config-dir` meets,
/// through a symlink and in subdirectories (kubernetes `cmd/kubelet/app/server.go`,
/// `mergeKubeletConfigurations`). inplaced reads a symlinked drop-in through its link
/// (its value overrides the field: not covered, the drop-in named), and a subdirectory
/// makes the config fields not covered, naming it (found by the session-7 break-it
/// tester: the field was covered and applied while the drop-in's value stayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_or_subdirectory_in_the_kubelet_config_dir_is_named() {
    const GC90: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nimageGCHighThresholdPercent: 90\n";
    let dir = |n: &Node| {
        std::fs::write(
            n.path("/etc/default/kubelet"),
            "KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n",
        )
        .unwrap();
        std::fs::create_dir_all(n.path("/etc/kubernetes/kubelet.conf.d")).unwrap();
    };
    let symlink = |n: &Node| {
        dir(n);
        std::fs::write(n.path("/etc/kubelet-site.conf"), GC90).unwrap();
        std::os::unix::fs::symlink(
            "/etc/kubelet-site.conf",
            n.path("/etc/kubernetes/kubelet.conf.d/50-site.conf"),
        )
        .unwrap();
    };
    let nested = |n: &Node| {
        dir(n);
        std::fs::create_dir_all(n.path("/etc/kubernetes/kubelet.conf.d/site")).unwrap();
        std::fs::write(
            n.path("/etc/kubernetes/kubelet.conf.d/site/50-site.conf"),
            GC90,
        )
        .unwrap();
    };
    for (prep, what, said) in [
        (
            &symlink as &dyn Fn(&Node),
            "a symlink (read through it)",
            "/etc/kubernetes/kubelet.conf.d/50-site.conf".to_string(),
        ),
        (
            &nested as &dyn Fn(&Node),
            "a subdirectory",
            "/etc/kubernetes/kubelet.conf.d/site is a subdirectory in the kubelet's --config-dir: the kubelet reads the *.conf files in it".to_string(),
        ),
    ] {
        let mut node = Node::new("ubuntu-2404-grub");
        prep(&node);
        node.start();
        let y = "kubelet:\n  config:\n    imageGCHighThresholdPercent: 85\n";
        let r = coverage(&node, y).await;
        let c = change(&r, "kubelet.config.imageGCHighThresholdPercent");
        assert!(!c.covered, "{what}: covered, though the kubelet merges 90 over it");
        assert!(c.reason.contains(&said), "{what}: {}", c.reason);
    }
}

/// Time daemons: a node symlink in chrony's confdir or timesyncd's drop-in directory
/// pointing at a file that adds sources (already there, or written by the spec's own
/// files item): both daemons read through the link, so `ntp` is not covered, naming the
/// link (found by the session-7 break-it tester: covered and Succeeded while the extra
/// sources stayed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_symlinked_time_daemon_file_adding_sources_is_named() {
    const NTP: &str = "ntp:\n  servers: [ntp1.example.invalid, ntp2.example.invalid]\n";
    let mut missed = Vec::new();
    for (written_by_spec, chrony) in [(false, true), (true, true), (false, false), (true, false)] {
        let mut node = Node::new(if chrony {
            "rhel8-grubenv"
        } else {
            "ubuntu-2404-grub"
        });
        let (dir, content) = if chrony {
            let conf = node.read("/etc/chrony.conf");
            std::fs::write(
                node.path("/etc/chrony.conf"),
                format!("{conf}confdir /etc/chrony/conf.d\n"),
            )
            .unwrap();
            ("/etc/chrony/conf.d", "pool site.example.invalid iburst\\n")
        } else {
            std::fs::write(node.path("/usr/lib/systemd/systemd-timesyncd"), "").unwrap();
            (
                "/etc/systemd/timesyncd.conf.d",
                "[Time]\\nNTP=site.example.invalid\\n",
            )
        };
        std::fs::create_dir_all(node.path(dir)).unwrap();
        std::fs::create_dir_all(node.path("/etc/site")).unwrap();
        let raw = content.replace("\\n", "\n");
        std::fs::write(
            node.path("/etc/site/time.conf"),
            if written_by_spec {
                "# site\n"
            } else {
                raw.as_str()
            },
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "/etc/site/time.conf",
            node.path(&format!("{dir}/50-site.conf")),
        )
        .unwrap();
        node.start();
        let y = if written_by_spec {
            format!("files:\n- path: /etc/site/time.conf\n  content: \"{content}\"\n{NTP}")
        } else {
            NTP.to_string()
        };
        let r = coverage(&node, &y).await;
        let c = change(&r, "ntp");
        assert!(
            c.reason.contains(&format!("{dir}/50-site.conf")),
            "chrony {chrony}, written by the spec {written_by_spec}: {}",
            c.reason
        );
        missed.push((chrony, written_by_spec, c.covered));
    }
    assert!(
        missed.iter().all(|(_, _, covered)| !covered),
        "ntp covered although a source-adding file the daemon reads stays: {missed:?}"
    );
}
